"""Default prompt templates, one per role action; `workflow.prompts.<name>=...` overrides any.

Plain and short on purpose: the tiny CPU model has a small context and learns these formats in
its warm-up. Real checkpoints get the same structure with their own wording through overrides.
"""
from __future__ import annotations

from typing import Dict

DEFAULT_PROMPTS: Dict[str, str] = {
    "solver": "solve: {question}",
    "generator": "solve: {question}",
    "generator_revise": "solve: {question}\nlast: {draft}\nnote: {feedback}",
    "evaluator": "check: {question} = {draft}",
    "voter": "vote: {question}",
    "aggregator": "pick: {question}\n{candidates}",
    "orchestrator": "plan: {question}",
    "worker": "work: {subtask}",
    "synthesizer": "join: {question}\nparts: {results}",
}


def resolve_prompts(overrides: Dict[str, str]) -> Dict[str, str]:
    unknown = sorted(set(overrides) - set(DEFAULT_PROMPTS))
    if unknown:
        from harness.config import ConfigError

        raise ConfigError(f"unknown prompt template(s) {unknown}; valid: {', '.join(DEFAULT_PROMPTS)}")
    return {**DEFAULT_PROMPTS, **overrides}
