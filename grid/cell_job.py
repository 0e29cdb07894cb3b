"""`python -m grid.cell_job <overrides.json>`: run one cell in this process, as a SLURM job's
command under slurm/ray-up.sh (RAY_ADDRESS is set, so engine=verl joins that cluster)."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    from harness.run import run_cell
    from harness.validation import config_from_dict

    overrides = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    state = run_cell(config_from_dict(overrides))
    return 0 if state in ("finished", "stopped_early") else 1


if __name__ == "__main__":
    sys.exit(main())
