# Two entry points (see README): `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
export OMP_NUM_THREADS ?= 1
export WANDB_MODE ?= offline

.PHONY: setup demo test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# CPU torch first where there is no GPU: otherwise pip pulls a multi-GB CUDA build.
	if command -v nvidia-smi >/dev/null 2>&1; then $(PIP) install -q "torch==2.11.0"; \
	else $(PIP) install -q "torch==2.13.0"; fi
	$(PIP) install -q -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

# The main job on the embedded default: the smoke sweep (every topology x {SP, IP} + the
# single-agent baseline) on the tiny CPU model, as local processes; then its status table.
demo: setup
	$(PY) grid/launch.py sweep=smoke

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) bench/probe_overhead.py

clean:
	rm -rf $(VENV) runs
