"""Prompt templates: the defaults (kept with the config schema, whose `workflow.prompts` they fill)
merged with a cell's overrides."""
from __future__ import annotations

from typing import Dict

from harness.config import DEFAULT_PROMPTS, ConfigError

__all__ = ["DEFAULT_PROMPTS", "resolve_prompts"]


def resolve_prompts(overrides: Dict[str, str]) -> Dict[str, str]:
    unknown = sorted(set(overrides) - set(DEFAULT_PROMPTS))
    if unknown:
        raise ConfigError(f"unknown prompt template(s) {unknown}; valid: {', '.join(DEFAULT_PROMPTS)}")
    return {**DEFAULT_PROMPTS, **overrides}
