"""`python -m reports <run or sweep dir> [...]`: (re)build the diagnostic reports on demand."""
from __future__ import annotations

import sys
from pathlib import Path

from reports.run_report import build_run_report
from reports.sweep_report import build_sweep_report, is_sweep


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    for target in map(Path, argv):
        if (target / "cell.yaml").is_file():
            print(build_run_report(target))
        elif is_sweep(target):
            for run in sorted(p.parent for p in target.glob("*/cell.yaml")):
                build_run_report(run)
            print(build_sweep_report(target))
        else:
            print(f"error: {target} is neither a run directory (cell.yaml) nor a sweep directory", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
