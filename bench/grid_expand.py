"""What expanding and checking a sweep costs per cell, at the study's size and at 1,000 cells.

Expansion (sweep -> cells with their overrides) plus the check `dry_run=true` and `action=launch`
run on every cell (harness.validation.config_from_dict), timed in-process after the imports; the
per-cell cost should not grow with the sweep.
Usage: python bench/grid_expand.py
"""
from __future__ import annotations

import time

from grid.expand import check_cells, expand
from grid.launch import compose


def timed(seeds: int) -> tuple[int, float, float]:
    cfg = compose(["sweep=full_matrix", f"sweep.axes.seed=[{','.join(map(str, range(seeds)))}]"])
    started = time.perf_counter()
    cells = expand(cfg.sweep, cfg.cluster, "runs")
    expanded = time.perf_counter()
    check_cells(cells, strict=False)
    return len(cells), expanded - started, time.perf_counter() - expanded


def main() -> None:
    timed(1)  # imports and first reads out of the measurement
    print(f"{'cells':>6} {'expand s':>9} {'check s':>8} {'ms per cell':>12}")
    for seeds in (1, 3, 24):
        n, expand_s, check_s = timed(seeds)
        print(f"{n:>6} {expand_s:>9.3f} {check_s:>8.3f} {(expand_s + check_s) / n * 1e3:>12.2f}")


if __name__ == "__main__":
    main()
