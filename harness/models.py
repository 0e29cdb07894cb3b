"""Models: a tiny Qwen3 built offline from a named size, or a real Qwen3 checkpoint on disk.

Both end up as one directory loaded with `AutoModelForCausalLM/AutoTokenizer.from_pretrained`,
so the engines never know which they got. Tiny models get a byte-level BPE tokenizer trained
locally with Qwen's special tokens and chat template, and a supervised warm-up on every role's
output contract (harness/warmup.py, which also caches the warm checkpoint). Nothing is downloaded, ever.
"""
from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Optional, Tuple

from harness.config import CellConfig, ConfigError

TINY_POSITIONS = 512  # max_position_embeddings of the tiny models
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinySize:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    warmup_steps: int
    warmup_lr: float = 3e-3
    warmup_batch: int = 32
    vocab: int = 320


@dataclass(frozen=True)
class CheckpointScale:
    dirname: str  # under $MARL_MODEL_ROOT unless model.path is given


@dataclass(frozen=True)
class RandomQwen3:
    """A random-initialised tiny Qwen3 over Qwen3's real tokenizer (harness/qwen3_tokenizer.py):
    no weights to download, yet the real vocabulary, special tokens, chat template and token
    counts, so the Qwen3 prompt path, parsers and budgets run on a CPU. It knows nothing (no
    warm-up): its replies are noise, which is what the contracts' fallbacks are for."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 256
    positions: int = 40960  # Qwen3-0.6B/1.7B/4B's max_position_embeddings: the study's budgets fit
    vocab: int = 151936  # Qwen3's embedding rows (the tokenizer's 151,669 tokens, padded)


SCALES: Dict[str, object] = {
    "tiny-s": TinySize(hidden=64, layers=2, heads=4, kv_heads=2, ffn=256, warmup_steps=2000),
    "tiny-m": TinySize(hidden=128, layers=2, heads=4, kv_heads=2, ffn=512, warmup_steps=1400),
    "tiny-l": TinySize(hidden=256, layers=4, heads=4, kv_heads=2, ffn=1024, warmup_steps=800),
    "qwen3-tok": RandomQwen3(),
    "qwen3-0.6b": CheckpointScale("Qwen3-0.6B"),
    "qwen3-1.7b": CheckpointScale("Qwen3-1.7B"),
    "qwen3-4b": CheckpointScale("Qwen3-4B"),
}


def is_tiny(scale: str) -> bool:
    return isinstance(SCALES[scale], TinySize)


def positions_of(scale: str) -> Optional[int]:
    """The context length of a model the harness builds; None for checkpoints (read from config.json)."""
    spec = SCALES[scale]
    return TINY_POSITIONS if isinstance(spec, TinySize) else getattr(spec, "positions", None)


def resolve_model_path(cfg: CellConfig) -> Optional[Path]:
    """The checkpoint directory of a real scale (checked to exist); None for scales built here."""
    spec = SCALES[cfg.scale]
    if not isinstance(spec, CheckpointScale):
        return None
    if cfg.model.path:
        path = Path(cfg.model.path).expanduser()
    elif os.environ.get("MARL_MODEL_ROOT"):
        path = Path(os.environ["MARL_MODEL_ROOT"]) / (cfg.model.dirname or spec.dirname)
    else:
        raise ConfigError(f"scale {cfg.scale} needs a local checkpoint: set model.path=/path/to/{spec.dirname} "
                          f"or MARL_MODEL_ROOT (no hub download at run time)")
    if not (path / "config.json").is_file():
        raise ConfigError(f"model path {path} for scale {cfg.scale} does not exist or holds no config.json")
    return path


def cache_root(cfg: CellConfig) -> Path:
    root = cfg.model.cache_dir or os.environ.get("MARL_CACHE") or "~/.cache/marl-harness"
    return Path(root).expanduser()


def build_tokenizer(corpus: Iterable[str], vocab_size: int):
    """Byte-level BPE with single-digit tokens (as Qwen), Qwen's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   padding_side="left")
    fast.chat_template = CHAT_TEMPLATE
    return fast


# keyed by the tokenizer object itself, held weakly: an id() key outlived its tokenizer, and a new one
# allocated at the same address (the Qwen3 tokenizer after a freed tiny one) was served the old template
_CHAT_CACHE: "weakref.WeakKeyDictionary[object, Tuple[str, str]]" = weakref.WeakKeyDictionary()


def chat_prompt(tokenizer, user_text: str) -> str:
    """The tokenizer's chat template around one user message, ready for generation.

    The template is rendered once per tokenizer (jinja is slow) and reused as a prefix/suffix.
    Thinking is off, as in the study (Qwen3's template honours `enable_thinking`; others ignore it).
    A prompt the study's rendering already framed (harness/chat.py) is returned as it is."""
    from harness.chat import Framed

    if isinstance(user_text, Framed):
        return str(user_text)
    if tokenizer not in _CHAT_CACHE:
        marker = "\x00MARKER\x00"
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                                 add_generation_prompt=True, enable_thinking=False)
        prefix, suffix = rendered.split(marker)
        _CHAT_CACHE[tokenizer] = (prefix, suffix)
    prefix, suffix = _CHAT_CACHE[tokenizer]
    return f"{prefix}{user_text}{suffix}"


def build_random_qwen3(spec: RandomQwen3, tokenizer, seed: int):
    """A seeded Qwen3ForCausalLM of `spec`'s shape over Qwen3's tokenizer (tied embeddings, as the small Qwen3s)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.ffn, num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads, head_dim=spec.hidden // spec.heads,
        max_position_embeddings=spec.positions, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


def build_tiny_model(size: TinySize, tokenizer, seed: int):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=size.hidden, intermediate_size=size.ffn,
        num_hidden_layers=size.layers, num_attention_heads=size.heads, num_key_value_heads=size.kv_heads,
        head_dim=size.hidden // size.heads, max_position_embeddings=TINY_POSITIONS, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)
