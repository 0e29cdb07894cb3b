"""Each detector's signal against its threshold over a run's steps, for the run report: the run's
logged metrics replayed through its own detector settings (cell.yaml), with the paired single-agent
run found beside it, exactly as the detectors judged them live (harness/monitors/detectors.py:
Traced). A reader sees how close a healthy run came to an alert, and what crossed when one fired."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import pandas as pd

TRACE_COLUMNS = ["step", "detector", "signal", "value", "threshold", "fires"]


def signal_trace(run: Path, records: Optional[List[dict]] = None, context=None) -> pd.DataFrame:
    """One row per (step, detector, signal): the value the detector compared and its threshold.
    `records` (the run's metrics.jsonl) and `context` (replay_setup's) when the caller has them."""
    from analysis.detector_validation import replay_setup
    from harness.run_dir import read_jsonl, stored_cell_config
    from harness.monitors import Monitor
    from harness.paired_run import paired_run

    run = Path(run)
    if records is None:
        records = read_jsonl(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []
    if not records:
        return pd.DataFrame(columns=TRACE_COLUMNS)
    context = context or replay_setup(run)
    monitors = stored_cell_config(run).monitors
    monitors.reference_run = context.monitors.reference_run  # the paired run beside the cell, as found now
    rows: list = []
    monitor = Monitor(monitors, context.role_policies, context.role_contracts, context.start, trace=rows,
                      reference=paired_run(monitors))
    for record in records:
        monitor.observe(record)
    return pd.DataFrame(rows, columns=TRACE_COLUMNS)
