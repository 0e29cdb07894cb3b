"""`python -m reports.indicators <sweep> [--design <sweep>]`: which logged signals lead failures.

Ranks every windowed signal of the sweep's cells by how well it separated failing from surviving
cells of the same setting 10, 20 and 30 steps before each failure (analysis/indicators.py: effect,
95% interval, within-setting permutation p, BH q), and draws the top signals' percentiles aligned at
the failure. Settings: those where the design sweep (`--design`; by default the sweep itself) has
at least two failing and two surviving cells. Writes <sweep>/report/indicators.{md,csv,png}.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Sequence

import pandas as pd

from analysis.indicators import LEADS, aligned_at_failure, aligned_table, contrasting_arms, indicator_table, load_cells
from reports.render import md_table, write

TOP = 20
PLOTTED = 4


def trajectories(table: pd.DataFrame, signals: Sequence[str], arms: Sequence[str], out: Path) -> Optional[Path]:
    """The top signals' median percentile among their setting's cells, failing vs surviving, by
    steps before the failure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not signals:
        return None
    fig, axes = plt.subplots(1, len(signals), figsize=(4 * len(signals), 3.2), squeeze=False)
    for ax, signal in zip(axes[0], signals):
        curves = aligned_at_failure(table, signal, arms, range(0, 45, 5))
        for group, part in curves.groupby("group"):
            ax.plot(part["lag"], part["value"], marker="o", label=group)
        ax.axhline(0.5, color="grey", lw=0.8, ls=":")
        ax.set_title(signal, fontsize=8)
        ax.set_xlabel("steps before the failure")
        ax.set_ylim(0, 1)
    axes[0][0].set_ylabel("median percentile in its setting")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def build(sweep: Path, design: Optional[Path] = None, permutations: int = 20000,
          table: Optional[pd.DataFrame] = None) -> Path:
    table = aligned_table(load_cells(sweep)) if table is None else table
    if table.empty:
        raise ValueError(f"{sweep} holds no multi-agent cell with logged steps")
    arms = contrasting_arms(aligned_table(load_cells(design)) if design else table)
    if not arms:
        raise ValueError(f"no setting of {design or sweep} has two failing and two surviving cells: nothing to compare")
    ranked = indicator_table(table, arms, permutations=permutations)
    out = Path(sweep) / "report"
    out.mkdir(parents=True, exist_ok=True)
    ranked.to_csv(out / "indicators.csv", index=False)
    plot = trajectories(table, list(dict.fromkeys(ranked["signal"]))[:PLOTTED], arms, out / "indicators.png")
    shown = ranked.head(TOP).assign(effect=lambda f: f["effect"].map("{:+.3f}".format),
                                    p=lambda f: f["p"].map("{:.4f}".format), q=lambda f: f["q"].map("{:.3f}".format))
    lines: List[str] = [f"# Leading indicators: {Path(sweep).name}", "",
                        f"Settings compared (two or more failing and surviving cells"
                        f"{' in ' + str(design) if design else ''}): {', '.join(arms)}.", "",
                        f"Leads {', '.join(map(str, LEADS))} steps; effect = the failing cells' mean percentile "
                        f"among their setting's cells at the same step, minus 0.5; p from {permutations:,} "
                        f"within-setting permutations; q Benjamini-Hochberg over all {len(ranked)} rows.", "",
                        md_table(shown), ""]
    if plot:
        lines += [f"![top signals aligned at the failure]({plot.name})", ""]
    write(out / "indicators.md", "\n".join(lines))
    return out / "indicators.md"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports.indicators", description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--design", type=Path, help="the sweep whose cells choose the settings (default: the sweep)")
    parser.add_argument("--permutations", type=int, default=20000)
    args = parser.parse_args(argv)
    for path in filter(None, (args.sweep, args.design)):
        if not path.is_dir():
            print(f"error: {path} is not a sweep directory", file=sys.stderr)
            return 2
    try:
        print(build(args.sweep, args.design, args.permutations))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
