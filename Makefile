# The whole set-up is `make sweep` and `make test`; every target installs what it needs.
PYTHON ?= python3
VENV ?= .venv
# The CPU build that lies on disk here. GPU users: make install TORCH='torch>=2.3'
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-fast bench lint clean sweep resume status export transfer report

# The embedded default sweep: tinylm on Python's stdlib sources, local Ray, 2 workers a trial.
NAME ?= default
SPACE ?= search_spaces/default.yaml
CLI := $(VENV)/bin/schedule-search

# Installed, and the package's own modules compiled: the editable install leaves them as
# source, and where PYTHONDONTWRITEBYTECODE is set (these machines) every process that imports
# them (a sweep's driver, each Tune trial, each Ray Train worker) compiled them again.
# compileall skips what is current, so this costs a second only after an edit.
install: $(STAMP)
	$(PY) -m compileall -q schedule_search

# Where pip looks for wheels on disk (its environment, else its configuration: these machines
# keep the CPU torch in such a folder), handed to uv, which reads neither.
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))

# Everything through uv, which resolves, downloads and unpacks in parallel; torch from the
# wheels on disk where pip would find it there (the CPU build). Compiled: these machines set
# PYTHONDONTWRITEBYTECODE, so an uncompiled package is compiled again by every process that
# imports it. The whole install in a new venv with empty caches: 35 s; 41 s with torch through
# pip (81 s with pip alone).
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv
	$(PY) -m uv pip install -q --python $(PY) --compile-bytecode \
		$(foreach folder,$(FIND_LINKS),--find-links $(folder)) "$(TORCH)" -e ".[sweep,hf,dev]"
	touch $(STAMP)

# Everything: real Ray sweeps, kills and gloo ranks, two tests at a time (pytest-xdist; each
# sweep has a local Ray of its own). The tests of the one shared sweep stay in one worker.
test: install
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=15

# The unit tier: no Ray, kills or multi-process runs (tests/integration holds those, each
# marked `slow`).
test-fast: install
	$(PY) -m pytest -q -n 2 tests/unit

sweep: install
	$(CLI) sweep $(SPACE) --name $(NAME)

resume: install
	$(CLI) resume $(NAME)

status: install
	$(CLI) status $(NAME)

export: install
	$(CLI) export $(NAME)

# Prove the exported recipe at 8x-32x against a per-horizon cosine envelope and WSD.
transfer: install
	$(CLI) transfer $(NAME)

# runs/$(NAME)/report/: markdown, plots, Optuna's views, TensorBoard event files.
report: install
	$(CLI) report $(NAME)

# Every figure of BENCHMARKS.md but the transfer study (`make transfer`: hours on 2 cores), the
# sweep's answer (`bench/sweep_answer.py`, 26 min), the tinylm search
# (`bench/search.py --task tinylm`, 22 min), the search over families
# (`bench/family_search.py --grid`, about 2 h, then `--study`; its AdamW half again with the
# raw losses for the forecast, `bench/raw_grid.py`, 45 min) and its four probes
# (`bench/seed_noise.py`, 8 min; `bench/sf_warmup.py`, 7 min; `bench/heldout_noise.py`, 4 min;
# `bench/window_size.py`, 25 min),
# the soak with random kills
# (`bench/soak.py`, about 25 min) and the public curves' extract (`bench/public_curves.py CLONE`:
# it needs a clone of github.com/fabian-sp/lr-scheduling; the check is a unit test).
bench: install
	$(PY) bench/core.py
	$(PY) bench/windows.py
	$(PY) bench/sharding.py
	$(PY) bench/windows_claim.py
	$(PY) bench/search.py --task linreg --seeds 10
	$(PY) bench/sweep_efficiency.py
	$(PY) bench/linreg_theory.py
	$(PY) bench/gpu.py
	$(PY) bench/forecast.py

lint: install
	$(VENV)/bin/ruff check schedule_search tests bench
	$(VENV)/bin/ruff format --check schedule_search tests bench
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
