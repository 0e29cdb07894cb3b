"""Studies as files: written down before they run, their per-cell outcomes committed, every figure
the docs quote regenerated from those outcomes.

A study lives in `studies/<name>/`:
- `study.yaml`, the preregistration, committed before anything runs: the question, the sweep and
  its commands, the design seeds (which may choose anything) and the held-out seeds (which only
  score, once), the hypotheses and the test that decides each, and `kind`, how its outcomes are scored;
- `outcomes.csv`, one row per cell (or arm), collected from the run directories once they ended
  (`python -m analysis.studies collect <name> --root <runs root>`);
- `results.md`, every figure the study reports, generated from `outcomes.csv` alone.

    python -m analysis.studies collect <name> --root runs    # run directories -> studies/<name>/outcomes.csv
    python -m analysis.studies render                        # results.md of every study, the docs' figure blocks,
                                                             # and harness/monitors/calibration.json
    python -m analysis.studies render --check                # exit 1 if anything would change (a test runs it)

A doc quotes a study's figures only inside a block the renderer owns:
`<!-- study:<name>:<block> -->` ... `<!-- /study -->`. A seed any study used to decide something (its
design seeds, or seeds the ledger marks spent) cannot be scored as held out (`refuse_decision_seeds`).
"""
from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set

import yaml

REPO = Path(__file__).resolve().parents[1]
STUDIES = REPO / "studies"
LEDGER = "ledger.yaml"  # seeds spent before studies were files: each chose something
BLOCK = re.compile(r"(<!-- study:(?P<name>[\w.-]+):(?P<block>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /study -->)", re.S)


class StudyError(ValueError):
    """A study file, its outcomes or a command about it is wrong: one line says what."""


def seed_list(value) -> List[int]:
    """[1, 2], "100-129", "100-104, 110" or 7 -> the seeds."""
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in seed_list(item)]
    seeds: List[int] = []
    for part in str(value).split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        seeds += list(range(int(low), int(high or low) + 1))
    return seeds


def seed_ranges(seeds: Sequence[int]) -> str:
    """[200, 201, 202, 205] -> "200-202, 205" (the inverse of seed_list)."""
    parts: List[str] = []
    run: List[int] = []
    for seed in sorted(set(seeds)):
        if run and seed != run[-1] + 1:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(seed)
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(parts) or "none"


@dataclass
class Study:
    name: str
    path: Path
    data: dict

    @property
    def kind(self) -> str:
        return str(self.data.get("kind", ""))

    def seeds(self, split: str) -> List[int]:
        return seed_list((self.data.get(split) or {}).get("seeds"))

    @property
    def outcomes_file(self) -> Path:
        return self.path / "outcomes.csv"

    def outcomes(self) -> List[dict]:
        if not self.outcomes_file.is_file():
            return []
        return list(csv.DictReader(self.outcomes_file.open(newline="")))


def load_studies(root: Path = STUDIES) -> List[Study]:
    studies = []
    for path in sorted(Path(root).glob("*/study.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        if data.get("name") != path.parent.name:
            raise StudyError(f"{path}: name '{data.get('name')}' is not its folder's name '{path.parent.name}'")
        studies.append(Study(path.parent.name, path.parent, data))
    return studies


def study_named(name: str, root: Path = STUDIES) -> Study:
    studies = {s.name: s for s in load_studies(root)}
    if name not in studies:
        raise StudyError(f"unknown study '{name}'; valid: {', '.join(sorted(studies)) or 'none'}")
    return studies[name]


def decision_seeds(root: Path = STUDIES) -> Dict[int, str]:
    """Seed -> the study (or ledger entry) that used it to decide something."""
    used: Dict[int, str] = {}
    ledger = Path(root) / LEDGER
    if ledger.is_file():
        for entry in (yaml.safe_load(ledger.read_text()) or {}).get("spent", []):
            for seed in seed_list(entry.get("seeds")):
                used.setdefault(seed, f"the ledger's {entry.get('sweep', '?')} ({entry.get('decided', '')})".strip())
    for study in load_studies(root):
        for seed in study.seeds("design") + seed_list(study.data.get("spent")):
            used.setdefault(seed, f"study {study.name}")
    return used


def refuse_decision_seeds(seeds: Set[int], root: Path = STUDIES) -> None:
    """ValueError naming the study that used one of `seeds` to decide something."""
    used = decision_seeds(root)
    clash = sorted(s for s in seeds if s in used)
    if clash:
        raise ValueError(f"seed {clash[0]} cannot be scored as held out: {used[clash[0]]} used it to decide "
                         f"something ({len(clash)} such seed(s): {', '.join(map(str, clash[:8]))}"
                         f"{' ...' if len(clash) > 8 else ''}); choose seeds no study has used (studies/)")


# ------------------------------------------------------------------ collect and render, per kind
Collector = Callable[[Study, Path], List[dict]]
Renderer = Callable[[Study, List[dict]], Dict[str, str]]
KINDS: Dict[str, tuple] = {}  # kind -> (collector, renderer), registered by the modules that score them


def register(kind: str, collect: Collector, render: Renderer) -> None:
    KINDS[kind] = (collect, render)


def _load_kinds() -> None:
    import analysis.study_early_warning  # noqa: F401  (registers every kind)
    import analysis.study_kinds  # noqa: F401
    from analysis import studies as imported  # run as `python -m analysis.studies`, this module is __main__

    KINDS.update(imported.KINDS)


def write_outcomes(study: Study, rows: List[dict]) -> Path:
    if not rows:
        raise StudyError(f"study {study.name}: no outcomes to write (have its runs ended?)")
    columns = list(dict.fromkeys(k for row in rows for k in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    study.outcomes_file.write_text(buffer.getvalue())
    return study.outcomes_file


def collect(name: str, runs_root: Path, root: Path = STUDIES) -> Path:
    _load_kinds()
    study = study_named(name, root)
    if study.kind not in KINDS:
        raise StudyError(f"study {name}: unknown kind '{study.kind}'; valid: {', '.join(sorted(KINDS))}")
    return write_outcomes(study, KINDS[study.kind][0](study, Path(runs_root)))


def rendered(root: Path = STUDIES) -> Dict[str, Dict[str, str]]:
    """study name -> block name -> markdown, for every study that has outcomes."""
    _load_kinds()
    out = {}
    for study in load_studies(root):
        rows = study.outcomes()
        if rows and study.kind in KINDS:
            out[study.name] = KINDS[study.kind][1](study, rows)
    return out


def results_page(study: Study, blocks: Dict[str, str]) -> str:
    head = [f"# {study.data.get('title', study.name)}", "",
            f"Generated by `python -m analysis.studies render` from `outcomes.csv`; the preregistration is "
            f"`study.yaml` (written before the runs). Do not edit by hand.", ""]
    body = []
    for block, text in blocks.items():
        if block.startswith("_"):
            continue
        body += [f"## {block.replace('-', ' ')}", "", text.rstrip(), ""]
    return "\n".join(head + body)


def doc_files() -> List[Path]:
    return [REPO / "README.md"] + sorted((REPO / "docs").rglob("*.md"))


def fill_blocks(text: str, figures: Dict[str, Dict[str, str]], where: str) -> str:
    def replace(match: re.Match) -> str:
        name, block = match.group("name"), match.group("block")
        if name not in figures or block not in figures[name]:
            raise StudyError(f"{where}: quotes study '{name}' block '{block}', which no study renders")
        return match.group(1) + figures[name][block].rstrip() + "\n" + match.group(5)

    return BLOCK.sub(replace, text)


def generated_files() -> Dict[str, Path]:
    """Rendered blocks that are files the harness reads: the calibration every alert quotes, the
    learned detector's model."""
    from harness.monitors.calibration import CALIBRATION_FILE
    from harness.monitors.learned import DEFAULT_MODEL

    return {"_calibration.json": CALIBRATION_FILE, "_learned.json": DEFAULT_MODEL}


def render(check: bool = False, root: Path = STUDIES) -> List[Path]:
    """Write (or, with `check`, compare) every generated file; returns the files that differ."""
    figures = rendered(root)
    targets: Dict[Path, str] = {}
    for study in load_studies(root):
        if study.name in figures:
            targets[study.path / "results.md"] = results_page(study, figures[study.name])
            for block, path in generated_files().items():
                if block in figures[study.name]:
                    targets[path] = figures[study.name][block]
    for path in doc_files():
        text = path.read_text()
        if BLOCK.search(text):
            targets[path] = fill_blocks(text, figures, str(path.relative_to(REPO)))
    differ = [path for path, text in targets.items() if not path.is_file() or path.read_text() != text]
    if not check:
        for path in differ:
            path.write_text(targets[path])
    return differ


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.studies", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="a study's run directories -> its outcomes.csv")
    c.add_argument("name")
    c.add_argument("--root", type=Path, default=Path("runs"), help="the runs root the study's sweeps ran under")
    r = sub.add_parser("render", help="results.md, the docs' figure blocks and calibration.json from the outcomes")
    r.add_argument("--check", action="store_true", help="change nothing; exit 1 if a generated file is stale")
    sub.add_parser("list", help="the studies, their kinds and seeds")
    args = parser.parse_args(argv)
    try:
        if args.command == "collect":
            print(collect(args.name, args.root))
        elif args.command == "render":
            differ = render(check=args.check)
            for path in differ:
                print(f"{'stale' if args.check else 'written'}: {path.relative_to(REPO)}")
            if args.check and differ:
                print("error: generated figures are stale; run python -m analysis.studies render", file=sys.stderr)
                return 1
        else:
            for study in load_studies():
                print(f"{study.name}: {study.kind}; design seeds {len(study.seeds('design'))}, "
                      f"held-out seeds {len(study.seeds('held_out'))}; outcomes: {len(study.outcomes())} rows")
    except StudyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
