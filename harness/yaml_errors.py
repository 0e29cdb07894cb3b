"""One readable line for a YAML file that does not parse: the file, line and column (1-based, as an
editor shows them) and what the parser expected there."""
from __future__ import annotations

from typing import Optional


def describe_yaml_error(exc: BaseException, source: Optional[str] = None) -> str:
    """`<file>:<line>:<column>: <problem>` from a yaml.MarkedYAMLError (any other error: its first line)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    where = source or (getattr(mark, "name", None) if mark is not None else None) or "<yaml>"
    if mark is not None:
        where = f"{where}:{mark.line + 1}:{mark.column + 1}"
    return f"{where}: {problem}" + (f" ({context})" if context else "")
