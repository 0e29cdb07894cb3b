"""Parsers for each role's output contract. Malformed output is resolved deterministically
(documented per parser) and flagged, never raised: a bad turn must not crash a run.

Two things are told apart for every judging turn:
- `malformed`: the reply does not follow its instruction exactly (format compliance, strict);
- `fallback`: no meaning could be read at all, so the documented default was used.
The tiny model's contracts are exact replies, parsed strictly (a malformed reply is a fallback,
but for a REVISE whose feedback is outside the task's vocabulary). Real
models (`tolerant=True`) wrap the statement in reasoning, markdown or a leaked `<think>` block:
with workflow.parse=tolerant their parsers read the last well-formed statement anywhere in the reply,
so a verdict with an explanation around it counts as that verdict and only its strict format check
fails; the default, workflow.parse=study, reads a verdict and a selection as the study's code does
(`study_verdict`, `study_index`: the first box).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

ACCEPT, REVISE = "ACCEPT", "REVISE"
CODE_FENCE = "```"

_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_BOXED = re.compile(r"\\boxed\s*\{\s*(?:\\text(?:bf)?\s*\{\s*)?([^{}]*?)\s*\}?\s*\}")
_POSITIVE = {"correct", "accept", "accepted", "right", "valid", "yes"}
_NEGATIVE = {"incorrect", "revise", "wrong", "invalid", "reject", "rejected", "flawed", "no", "not correct",
             "incorrectly"}


@dataclass(frozen=True)
class Verdict:
    verdict: str  # ACCEPT | REVISE
    feedback: str
    malformed: bool
    fallback: bool = False


def visible(text: str) -> str:
    """The reply without reasoning the model was not asked for: a closed `<think>` block is
    dropped, and an unclosed one leaves only what follows it (nothing, if nothing does)."""
    text = _THINK.sub("", text)
    if "<think>" in text.lower():
        text = text[: text.lower().index("<think>")]
    return text.replace("</think>", "")


def _plain(text: str) -> str:
    return visible(text).replace("**", "").replace("__", "")


def parse_verdict(text: str, feedback_vocabulary: Sequence[str] = (), tolerant: bool = False,
                  unparsed: str = ACCEPT) -> Verdict:
    """tiny: 'ACCEPT' or 'REVISE: <feedback>' as the whole reply; anything else is `unparsed`
    (ACCEPT ends the loop) and malformed. A verdict that carries a code block is malformed too:
    an evaluator writing code is the symptom of role capture.

    tolerant (Qwen3 prompts, strict format `\\boxed{Correct}` / `\\boxed{Incorrect}`; a `FEEDBACK:`
    line, where a reply has one, is the feedback): the last boxed verdict, else the last labelled one ('Verdict: REVISE'), else
    the last verdict word of the reply's final sentences ('... is not correct'); none: `unparsed`
    (the study's REVISE: keep refining)."""
    if not tolerant:
        return _strict_verdict(text, feedback_vocabulary, unparsed)
    has_code = CODE_FENCE in text
    body = _plain(text)
    verdict = _tolerant_verdict(body)
    feedback = _feedback(body)
    boxed = [m.group(1).strip() for m in _BOXED.finditer(visible(text))]
    exact = (len(boxed) == 1 and boxed[0] in ("Correct", "Incorrect") and "\\boxed{" + boxed[0] + "}" in text
             and not has_code)
    if verdict is None:
        return Verdict(unparsed, feedback if unparsed == REVISE else "", True, True)
    return Verdict(verdict, feedback if verdict == REVISE else "", not exact, False)


def _strict_verdict(text: str, feedback_vocabulary: Sequence[str], unparsed: str) -> Verdict:
    stripped = text.strip()
    has_code = CODE_FENCE in stripped
    head = stripped.split(":", 1)[0].strip().upper() if stripped else ""
    if head == ACCEPT and stripped.upper() == ACCEPT and not has_code:
        return Verdict(ACCEPT, "", False)
    if head == REVISE and not has_code:
        feedback = stripped.split(":", 1)[1].strip() if ":" in stripped else ""
        malformed = bool(feedback_vocabulary) and feedback not in feedback_vocabulary
        return Verdict(REVISE, feedback, malformed)
    return Verdict(unparsed, "", True, True)


def _word_verdict(word: str) -> Optional[str]:
    word = re.sub(r"\s+", " ", word.strip().lower().strip(".!*:`'\" "))
    if word in _NEGATIVE or word.startswith(("incorrect", "not correct", "wrong", "revise")):
        return REVISE
    if word in _POSITIVE or word.startswith(("correct", "accept")):
        return ACCEPT
    return None


_LABELLED = re.compile(r"(?:verdict|judg(?:e)?ment|conclusion|assessment|evaluation|decision)\s*(?:is)?\s*[:\-=]?\s*"
                       r"(not\s+correct|incorrect|correct|accept(?:ed)?|revise|wrong|right|invalid|valid|reject(?:ed)?)",
                       re.I)
_PHRASE = re.compile(r"\b(not\s+(?:\w+\s+)?correct|incorrect(?:ly)?|wrong|flawed|invalid|revise|correct|accept(?:ed)?|"
                     r"valid|right)\b", re.I)
_NEGATION_BEFORE = re.compile(r"\b(?:not|n't|never|isn't|aren't)\s+(?:\w+\s+){0,2}$", re.I)


def _tolerant_verdict(body: str) -> Optional[str]:
    for match in reversed(list(_BOXED.finditer(body))):
        verdict = _word_verdict(match.group(1))
        if verdict:
            return verdict
    labelled = list(_LABELLED.finditer(body))
    if labelled:
        return _word_verdict(labelled[-1].group(1))
    lines = [line for line in body.splitlines() if line.strip() and not line.strip().upper().startswith("FEEDBACK")]
    for line in reversed(lines[-3:]):  # the conclusion sits at the end of the reply
        phrases = list(_PHRASE.finditer(line))
        if phrases:
            last = phrases[-1]
            verdict = _word_verdict(last.group(1))
            if verdict == ACCEPT and _NEGATION_BEFORE.search(line[: last.start()]):
                return REVISE
            return verdict
    return None


def _feedback(body: str) -> str:
    """The text after the last `FEEDBACK:` label, else the reply without its boxed verdict."""
    found = re.findall(r"feedback\s*[:\-]\s*(.+)", body, re.I)
    text = found[-1] if found else _BOXED.sub("", body)
    return " ".join(text.split())[:300]


PARSES = ("study", "tolerant")  # how the real-model contracts read a verdict and a selection (workflow.parse)
_STUDY_VERDICT = re.compile(r"\\boxed\{(Correct|Incorrect)\}", re.I)
_STUDY_INDEX = re.compile(r"\\boxed\{(\d+)\}", re.I)
_STUDY_DIGIT = re.compile(r"\b([1-9])\b")


def study_verdict(text: str, unparsed: str = REVISE) -> Verdict:
    """The study's verdict parse (examples/math_reasoning/evaluator_optimizer_math_workflow.py
    l.183-194): the first `\\boxed{Correct}` / `\\boxed{Incorrect}`, any case; none: `unparsed` (the
    study keeps refining). Feedback: a `FEEDBACK:` line if the reply has one, else the reply without its
    box (under the study's chat the reviser reads the whole reply in the conversation instead).
    Malformed: not exactly one box, or code in the verdict."""
    body = visible(text)
    found = list(_STUDY_VERDICT.finditer(body))
    if not found:
        return Verdict(unparsed, _feedback(_plain(text)) if unparsed == REVISE else "", True, True)
    verdict = ACCEPT if found[0].group(1).lower() == "correct" else REVISE
    malformed = len(found) != 1 or CODE_FENCE in text or found[0].group(1) not in ("Correct", "Incorrect")
    return Verdict(verdict, _feedback(_plain(text)) if verdict == REVISE else "", malformed, False)


def study_index(text: str, n: int, base: int = 1) -> Tuple[int, bool, bool]:
    """The study's selection parse (examples/math_reasoning/voting_math_workflow.py l.158-184, the
    code workflow's l.175-201 alike): the first `\\boxed{<digits>}` if in range (an out-of-range first
    box does not look further), else the first standalone digit 1-9 anywhere if in range, else
    candidate 1 (a fallback). Malformed: not one in-range box as the only box, or code in the reply."""
    body = visible(text)
    boxes = list(_STUDY_INDEX.finditer(body))
    if boxes and base <= int(boxes[0].group(1)) < base + n:
        return int(boxes[0].group(1)) - base, len(boxes) != 1 or CODE_FENCE in text, False
    digit = _STUDY_DIGIT.search(body)
    if digit and base <= int(digit.group(1)) < base + n:
        return int(digit.group(1)) - base, True, False
    return 0, True, True


def parse_index(text: str, n: int, tolerant: bool = False, base: int = 0) -> Tuple[int, bool, bool]:
    """(0-based index, malformed, fallback). tiny: a bare index in [0, n); anything else picks
    candidate 0 and is malformed.

    tolerant (Qwen3 prompts, solutions numbered from `base`, strict format one `\\boxed{N}`):
    the last boxed number, else the last 'selected/choose/best solution is N' statement, else the
    last 'Solution N' named in the final line, else a lone number on the final line; out of range
    counts as not found; none: candidate 0 (the study's fallback)."""
    if not tolerant:
        stripped = text.strip()
        if re.fullmatch(r"\d+", stripped) and int(stripped) < n:
            return int(stripped), False, False
        return 0, True, True
    body = _plain(text)
    boxed = [m.group(1) for m in _BOXED.finditer(visible(text))]
    exact = (len(boxed) == 1 and re.fullmatch(r"\d+", boxed[0] or "") is not None
             and base <= int(boxed[0]) < base + n and CODE_FENCE not in text)
    for number in _index_candidates(body):
        if base <= number < base + n:
            return number - base, not exact, False
    return 0, True, True


_SOLUTION = r"(?:solution|candidate|option|answer|response)\s*(?:number|no\.?|#)?\s*"
_SELECTED = re.compile(r"(?:select(?:ed|ion)?|choose|chose|choice|pick(?:ed)?|best\s+(?:\w+\s+){0,2}is|"
                       r"most\s+likely\s+correct\s+(?:\w+\s+){0,2}is|go(?:ing)?\s+with)\s*(?:is)?\s*[:\-=]?\s*"
                       r"(?:" + _SOLUTION + r")?(\d+)", re.I)
_NAMED = re.compile(_SOLUTION + r"(\d+)", re.I)
_ORDINALS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5}
_PRAISED = re.compile(r"(?:correct|best|right)\s+(?:one|solution|candidate|answer)\s+is\s+(?:" + _SOLUTION + r")?(\d+)|"
                      + _SOLUTION + r"(\d+)\s+is\s+(?:the\s+)?(?:correct|best|right|most\s+likely)", re.I)
_ORDINAL_CHOICE = re.compile(r"(?:go(?:ing)?\s+with|choose|select|pick|prefer)\s+the\s+(first|second|third|fourth|fifth)\b",
                             re.I)


def _index_candidates(body: str) -> List[int]:
    """Numbers the reply states as its choice, most authoritative first."""
    found: List[int] = []
    for match in reversed(list(_BOXED.finditer(body))):
        digits = re.findall(r"\d+", match.group(1) or "")
        if len(digits) == 1:
            found.append(int(digits[0]))
    found += [int(m.group(1)) for m in reversed(list(_SELECTED.finditer(body)))]
    found += [_ORDINALS[m.group(1).lower()] for m in reversed(list(_ORDINAL_CHOICE.finditer(body)))]
    found += [int(m.group(1) or m.group(2)) for m in _PRAISED.finditer(body)][:1]  # the first praise is the verdict
    lines = [line for line in body.splitlines() if line.strip()]
    if lines:
        last = lines[-1]
        found += [int(m.group(1)) for m in reversed(list(_NAMED.finditer(last)))]
        lone = re.fullmatch(r"\D*?(\d+)\D*", last.strip())
        if lone:
            found.append(int(lone.group(1)))
    return found


def parse_subtasks(text: str, max_subtasks: int, fallback: str, tolerant: bool = False) -> Tuple[List[str], bool, bool]:
    """(subtasks, malformed, fallback). tiny: subtasks separated by ';' or newlines, at most
    max_subtasks. None parsed: the whole problem is one subtask (malformed). Too many: the first
    max_subtasks are kept (malformed).

    tolerant (Qwen3 prompts, strict format `STRATEGY k: ...` lines numbered 1..m, m <= max; a search
    decomposer's `SUBQUERY k: ...` alike):
    'STRATEGY k:' items, else a numbered list ('1.', '1)', 'Step 1:'), else a bulleted list;
    the first max_subtasks are kept; none: the whole problem (malformed, fallback)."""
    if not tolerant:
        parts = [p.strip() for p in re.split(r"[;\n]", text) if p.strip()]
        if not parts:
            return [fallback], True, True
        if len(parts) > max_subtasks:
            return parts[:max_subtasks], True, False
        return parts, False, False
    body = _plain(text)
    strategies = re.findall(r"^[ \t>#]*(?:strategy|sub-?query)\s*(\d+)\s*[:.)\-–—]+\s*(.+?)\s*$", body, re.I | re.M)
    items = strategies or re.findall(r"^[ \t>#]*(?:step\s*)?(\d+)\s*[.):\-–—]+\s+(.+?)\s*$", body, re.I | re.M)
    items = items or [("", m) for m in re.findall(r"^[ \t]*[-*•]\s+(.+?)\s*$", body, re.M)]
    parts = [_strip_label(item) for _, item in items if _strip_label(item)]
    if not parts:
        return [fallback], True, True
    numbers = [int(k) for k, _ in strategies]
    exact = bool(strategies) and numbers == list(range(1, len(numbers) + 1)) and len(numbers) <= max_subtasks \
        and re.search(r"^\s*(?:STRATEGY|SUBQUERY) 1: ", visible(text), re.M) is not None
    return parts[:max_subtasks], not exact, False


def _strip_label(item: str) -> str:
    """'[Algebra] set up ...' and 'Algebra: ...' keep their words; brackets the template showed go."""
    return item.strip().strip("[]").strip()


def parse_answer(text: str, extract) -> tuple[Optional[str], bool]:
    """The task's own extraction; no answer found is malformed."""
    answer = extract(text)
    return answer, answer is None


@dataclass(frozen=True)
class SearchAction:
    stop: bool
    query: str  # '' when stopping
    malformed: bool
    fallback: bool = False


_SEARCH = re.compile(r"^[ \t>#*]*search\s*[:：]\s*(.+?)\s*$", re.I | re.M)
_STOP = re.compile(r"^[ \t>#*]*stop\b", re.I | re.M)


def parse_search(text: str, tolerant: bool = False) -> SearchAction:
    """A search role's next action (M-ASK's planning and search agents): `SEARCH: <query>` or
    `STOP`. tiny: exactly one of them as the whole reply. tolerant: the last such line anywhere.
    Nothing readable stops the search (fallback): a loop never runs on a guess."""
    body = _plain(text).strip()
    if not tolerant:
        match = re.fullmatch(r"SEARCH:\s*(\S.*)", body)
        if match and "\n" not in body:
            return SearchAction(False, match.group(1).strip(), False)
        if body == "STOP":
            return SearchAction(True, "", False)
        return SearchAction(True, "", True, True)
    actions = [(m.start(), False, m.group(1)) for m in _SEARCH.finditer(body)]
    actions += [(m.start(), True, "") for m in _STOP.finditer(body)]
    if not actions:
        return SearchAction(True, "", True, True)
    _, stop, query = max(actions)
    exact = body == "STOP" if stop else re.fullmatch(r"SEARCH: \S.*", body) is not None
    return SearchAction(stop, query.strip(), not exact)


def parse_text(text: str, tolerant: bool = False) -> Tuple[str, bool, bool]:
    """(text, malformed, fallback) of a free-text role (evidence, notes, a plan): tiny wants one
    non-empty line; tolerant takes the visible reply. Empty: '' (fallback)."""
    body = visible(text).strip()
    if not body:
        return "", True, True
    return body, (not tolerant) and "\n" in body, False
