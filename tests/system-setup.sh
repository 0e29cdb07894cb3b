#!/usr/bin/env bash
# What the test suite needs beyond the Python environment, set up by `make test`:
#   - a browser for the HTML report tests: Debian's chromium (found on PATH, or $CHROMIUM)
#   - a real local SLURM cluster (slurm/local-cluster.sh installs its packages and starts it)
#   - bubblewrap, the jail of the sandbox for model-written code
# As root on Debian/Ubuntu it installs and starts them. Elsewhere it checks, names each missing
# piece with the command that provides it, and fails before any test runs.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "[test-setup] $*"; }
have_browser() { [ -n "${CHROMIUM:-}" ] && [ -x "$CHROMIUM" ] || command -v chromium >/dev/null || command -v chromium-browser >/dev/null; }

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  wanted=()
  have_browser || wanted+=(chromium)
  command -v bwrap >/dev/null || wanted+=(bubblewrap)
  if [ ${#wanted[@]} -gt 0 ]; then
    say "installing Debian's ${wanted[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q "${wanted[@]}" >/dev/null
  fi
  bash slurm/local-cluster.sh start
  exit 0
fi

missing=0
if ! have_browser; then
  say "missing: a Chromium browser for the report tests. Install it (Debian/Ubuntu: sudo apt-get install chromium)"
  say "         or point CHROMIUM=/path/to/chromium at one."
  missing=1
fi
if ! command -v bwrap >/dev/null; then
  say "missing: bubblewrap, the jail for model-written code. Install it (Debian/Ubuntu: sudo apt-get install bubblewrap)"
  missing=1
fi
if ! sinfo -h -o %T 2>/dev/null | grep -q .; then
  say "missing: a running SLURM cluster for the grid tests. Start the local one as root:"
  say "         sudo bash slurm/local-cluster.sh start   (Debian/Ubuntu; installs munge, slurm, slurmdbd, mariadb)"
  missing=1
fi
exit $missing
