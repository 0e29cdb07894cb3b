"""Parsers for each role's output contract. Malformed output is resolved deterministically
(documented per parser) and flagged, never raised: a bad turn must not crash a run."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Sequence

ACCEPT, REVISE = "ACCEPT", "REVISE"
CODE_FENCE = "```"


@dataclass(frozen=True)
class Verdict:
    verdict: str  # ACCEPT | REVISE
    feedback: str
    malformed: bool


def parse_verdict(text: str, feedback_vocabulary: Sequence[str] = ()) -> Verdict:
    """'ACCEPT' or 'REVISE: <feedback>'. Anything else counts as ACCEPT (ends the loop) and malformed.

    A verdict that carries a code block is malformed too: an evaluator writing code is the
    symptom of role capture."""
    stripped = text.strip()
    has_code = CODE_FENCE in stripped
    head = stripped.split(":", 1)[0].strip().upper() if stripped else ""
    if head == ACCEPT and stripped.upper() == ACCEPT and not has_code:
        return Verdict(ACCEPT, "", False)
    if head == REVISE and not has_code:
        feedback = stripped.split(":", 1)[1].strip() if ":" in stripped else ""
        malformed = bool(feedback_vocabulary) and feedback not in feedback_vocabulary
        return Verdict(REVISE, feedback, malformed)
    return Verdict(ACCEPT, "", True)


def parse_index(text: str, n: int) -> tuple[int, bool]:
    """A bare candidate index in [0, n). Anything else picks candidate 0 and is malformed."""
    stripped = text.strip()
    if re.fullmatch(r"\d+", stripped) and int(stripped) < n:
        return int(stripped), False
    return 0, True


def parse_subtasks(text: str, max_subtasks: int, fallback: str) -> tuple[List[str], bool]:
    """Subtasks separated by ';' or newlines, at most max_subtasks. None parsed: the whole
    problem is one subtask (malformed). Too many: the first max_subtasks are kept (malformed)."""
    parts = [p.strip() for p in re.split(r"[;\n]", text) if p.strip()]
    if not parts:
        return [fallback], True
    if len(parts) > max_subtasks:
        return parts[:max_subtasks], True
    return parts, False


def parse_answer(text: str, extract) -> tuple[Optional[str], bool]:
    """The task's own extraction; no answer found is malformed."""
    answer = extract(text)
    return answer, answer is None
