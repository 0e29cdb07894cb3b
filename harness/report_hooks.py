"""Reports attach themselves to the harness: an installed package names its builders under the entry-point
group `marl_harness.reports` (run, sweep, interventions: pyproject.toml), and a run or a sweep that ends
calls the one for its kind. The harness and the grid never import `reports/`: reports read run directories,
and the arrow points from them to the harness, not back."""
from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path
from typing import Callable, Optional

GROUP = "marl_harness.reports"
KINDS = ("run", "sweep", "interventions")


def report_builder(kind: str) -> Optional[Callable[[Path], Path]]:
    """The builder registered for `kind` (directory in, the report's index.html out), or None when no
    installed package registers one (a checkout used without `pip install -e .`)."""
    if kind not in KINDS:
        raise ValueError(f"unknown report kind '{kind}'; valid choices: {', '.join(KINDS)}")
    found = [ep for ep in entry_points(group=GROUP) if ep.name == kind]
    return found[0].load() if found else None


def build_report(kind: str, directory: Path) -> Path:
    """The `kind` report of `directory`, drawn by its registered builder; a clear error without one."""
    builder = report_builder(kind)
    if builder is None:
        raise LookupError(f"no {kind} report builder is installed (entry point group {GROUP}); "
                          f"install the project with pip install -e . or draw it with python -m reports {directory}")
    return builder(Path(directory))
