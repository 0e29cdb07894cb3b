"""How a prompt reaches the model, per prompt set.

`template` (tiny models, as their warm-up showed them): the tokenizer's chat template around one
user message (harness/models.py chat_prompt).

`study` (the Qwen3 prompt set): the text the study's trainer feeds its tokenizer. rllm's verl engine
renders every request with `QwenChatTemplateParser(disable_thinking=True).parse(messages,
add_generation_prompt=True, is_first_msg=True)` (upstream rllm/engine/rollout/verl_engine.py:69,
rllm/parser/chat_template_parser.py:355-470, disable_thinking from
rllm/trainer/config/multi_agent_ppo_trainer.yaml:106): Qwen's default system message first, and
every assistant turn, earlier replies included, opened by an empty think block. For one user
message this is what Qwen3's own template gives with that system message and thinking off
(tests/test_chat.py); for a conversation (Eval-Opt's shared history) the two differ, and the
study's trainer used the parser.
"""
from __future__ import annotations

import re
from typing import Sequence, Tuple

CHATS = ("template", "study")
STUDY_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."  # parser l.396
_ASSISTANT = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # the parser's assistant token, thinking disabled
_TOOL_CALL = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)

Message = Tuple[str, str]  # (role: user | assistant, content)


class Framed(str):
    """A prompt already in the model's chat format: the engines tokenize it as it is."""


def study_chat(messages: Sequence[Message]) -> Framed:
    """The study's rendering of a conversation, ready for the next assistant reply."""
    parts = [f"<|im_start|>system\n{STUDY_SYSTEM}<|im_end|>\n"]
    for role, content in messages:
        if role == "user":
            parts.append(f"<|im_start|>user\n{content}<|im_end|>\n")
        elif role == "assistant":
            parts.append(f"{_ASSISTANT}{content.strip()}<|im_end|>\n")
        else:
            raise ValueError(f"a chat message's role is user or assistant, got '{role}'")
    parts.append(_ASSISTANT)
    return Framed("".join(parts))


def reply_content(text: str) -> str:
    """What the study keeps of a reply in the conversation (the parser's parse_completion with
    thinking disabled, l.509-545): the text after a single `</think>`, tool-call blocks removed, stripped."""
    if text.count("</think>") == 1:
        text = text.partition("</think>")[2]
    return _TOOL_CALL.sub("", text.strip()).strip()


def frame(chat: str, history: Sequence[Message], user_text: str) -> str:
    """A turn's prompt: the user text alone (`template`: the engine wraps it in the tokenizer's
    template), or the conversation so far and the user text as the study renders them."""
    if chat == "study":
        return study_chat([*history, ("user", user_text)])
    if history:
        raise ValueError("a conversation needs the study's chat rendering; the template chat renders one message")
    return user_text
