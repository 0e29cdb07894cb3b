"""The package's import structure: the config schema imports nothing else of the harness, and no
two modules need each other (a cycle held together by imports inside functions breaks whenever
someone moves one of those imports to the top)."""
from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Set

REPO = Path(__file__).resolve().parents[1]


def import_graph(package: str = "harness") -> Dict[str, Set[str]]:
    """Module -> harness modules it imports anywhere (top level or inside functions)."""
    modules = {}
    for path in (REPO / package).rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    graph: Dict[str, Set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t != name}
    return {name: graph[name] for name in modules}


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_harness_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_cycle_finder_sees_a_cycle_through_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_config_imports_nothing_else_of_the_harness():
    assert import_graph()["harness.config"] == set()
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, harness.config; print(sorted(m for m in sys.modules if m.startswith('harness')))"],
        cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "['harness', 'harness.config']"


def test_the_configuration_stays_under_1200_lines():
    """The schema with its declared checks, the rules between sections, the CLI parsing: one size a
    reader can hold (it was 1,305 lines when each choice was also checked by hand in validate())."""
    files = ["harness/config.py", "harness/validation.py", "harness/cli_overrides.py", "harness/yaml_errors.py"]
    assert sum(len((REPO / f).read_text().splitlines()) for f in files) < 1200


def test_metric_keys_are_built_in_one_module():
    """role/<r>/<s>, role/<r>/<i>/<s> and policy/<p>/<s> are built by harness/metric_keys.py alone: a
    key written one way in the controller and read another way in a detector was a silent miss."""
    import re

    pattern = re.compile(r"""f["'](?:role|policy)/""")
    found = [f"{path.relative_to(REPO)}:{n}" for folder in ("harness", "analysis", "reports", "grid")
             for path in sorted((REPO / folder).rglob("*.py")) if path.name != "metric_keys.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []


def test_metric_keys_parse_what_they_build():
    from harness.metric_keys import instance_key, names_in, parse, policy_key, role_key

    assert parse(role_key("voter", "grad_share")) == ("role", "voter", "grad_share", None)
    assert parse(instance_key("voter", 2, "grad_norm")) == ("role", "voter", "grad_norm", 2)
    assert parse(policy_key("shared", "drift")) == ("policy", "shared", "drift", None)
    assert parse("val/accuracy") is None and parse("accuracy") is None
    record = {role_key("voter", "entropy"): 1, role_key("aggregator", "entropy"): 2,
              instance_key("voter", 0, "entropy"): 3, policy_key("voter", "entropy"): 4}
    assert names_in(record, "role", "entropy") == ["aggregator", "voter"]


def test_detectors_read_no_files():
    """The detectors, the monitor and the paired stream they compare with are functions of the records
    their caller hands them: the paired run is followed on disk by harness/paired_run.py, not here."""
    import re

    io = re.compile(r"\bopen\(|read_text\(|\.stat\(\)|\bPath\(|json\.load\(")
    found = [f"{name}:{n}" for name in ("base.py", "detectors.py", "monitor.py", "features.py")
             for n, line in enumerate((REPO / "harness" / "monitors" / name).read_text().splitlines(), 1)
             if io.search(line)]
    assert found == []
    assert "harness.paired_run" not in set().union(*(import_graph()[f"harness.monitors.{m}"]
                                                      for m in ("base", "detectors", "monitor", "features")))


def test_the_harness_and_the_grid_never_import_the_reports():
    """Reports attach through the `marl_harness.reports` entry points (harness/report_hooks.py): a run and
    a sweep that end call the builder installed for their kind, without an arrow back up to reports/."""
    from harness.report_hooks import KINDS, build_report, report_builder

    importing = [f"{path.relative_to(REPO)}:{n}" for folder in ("harness", "grid")
                 for path in sorted((REPO / folder).rglob("*.py"))
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if line.strip().startswith(("from reports", "import reports"))]
    assert importing == []
    assert all(report_builder(kind).__module__.startswith("reports.") for kind in KINDS)  # installed and found
    import pytest

    with pytest.raises(ValueError, match="valid choices: run, sweep, interventions"):
        build_report("notebook", REPO)
