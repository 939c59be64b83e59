# The README's two commands are `make run` and `make test`; both set up .venv once and reuse it.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
# The installer: uv installs the lock as it stands, without resolving, in parallel from its cache.
UV_VERSION := 0.13.8
# uv does not read pip's configuration: pass this machine's wheel folder and local package indexes
# where they exist. The CPU build of torch that the lock pins (torch==2.13.0+cpu) is in /opt/wheels.
# Elsewhere the same wheel comes from the PyTorch CPU index.
UV_SOURCES := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,--extra-index-url https://download.pytorch.org/whl/cpu) \
	$(foreach index,/opt/pypi/simple /opt/pypi-more/simple,$(if $(wildcard $(index)),--extra-index-url file://$(index))) \
	--index-strategy unsafe-best-match
# TLS through the platform's certificate store, as pip does here (a proxy's CA is trusted there).
export UV_SYSTEM_CERTS := 1
# The lock is resolved for the machines the project runs on (CPython 3.11 on x86_64 Linux).
LOCK_TARGET := --python-version 3.11 --python-platform x86_64-manylinux_2_28
# Python caches compiled modules in .venv (__pycache__), so only the first process after an install
# compiles torch, transformers and Dagster; a shell that turns the cache off (PYTHONDONTWRITEBYTECODE)
# would have every run, test worker and subprocess compile them again.
unexport PYTHONDONTWRITEBYTECODE
# Runs land in the project's own Dagster instance, so `make ui` shows them afterwards.
export DAGSTER_HOME := $(CURDIR)/.dagster_home

.PHONY: setup run run-all results seeds train-paper tensorboard test test-slow ui bench bench-default-run lock clean

$(UV):
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet uv==$(UV_VERSION)

# The environment is exactly requirements.lock (hash-checked; anything else is removed), plus this
# project installed editable.
$(VENV)/.installed: requirements.lock pyproject.toml | $(UV)
	$(UV) pip sync --quiet --python $(PY) --require-hashes $(UV_SOURCES) requirements.lock
	$(UV) pip install --quiet --python $(PY) --no-deps -e .
	touch $@

setup: $(VENV)/.installed
	mkdir -p $(DAGSTER_HOME)
	test -f $(DAGSTER_HOME)/dagster.yaml || cp data/dagster.yaml $(DAGSTER_HOME)/dagster.yaml

## Materialize what is missing or stale in the asset graph on the embedded default pool, headless,
## and print the headline tables; then evaluate the trained conductor on UNSEEN_POOL, six test models
## it never saw (assets/evaluate_checkpoint.py --trained --quick; `make seeds` adds its warm start and shuffled twin).
UNSEEN_POOL ?= replay-test-six
run: setup
	$(PY) -m assets.main
	$(PY) -m assets.evaluate_checkpoint --trained --quick --pool $(UNSEEN_POOL)

## Record the latest run's figures (docs/results/default-run.json) and rewrite the README's results block.
results: setup
	$(PY) -m assets.results

## Recompute every asset, stale or not.
run-all: setup
	$(PY) -m assets.main --force

## The paper's rollout budget on the tiny CPU policy (trainer profile cpu-paper: groups of 64 x 4
## questions x 200 steps = 51,200 rollouts), then the evaluation, on POOL; curves live in `make tensorboard`.
## CONFIG=FILE passes a run-settings YAML (`--config`, assets/run_settings.py), e.g. trainer knobs.
POOL ?= replay-mixed6
CONFIG ?=
train-paper: setup
	CORYPHAEUS_TRAINER_PROFILE=cpu-paper $(PY) -m assets.main --pool $(POOL) $(if $(CONFIG),--config $(CONFIG))

## A recipe over SEEDS (default 0 1 2): one `make run` per seed (`--seed N`: runs tagged seed and recipe,
## each seed's checkpoints kept apart, a killed seed resumes), then its verdicts pooled over the seeds
## (assets/seeds.py). PROFILE (e.g. cpu-paper), POOL and CONFIG pick the recipe, as for train-paper; each
## seed's conductor is also evaluated on UNSEEN_POOL. The conductor for any pool trains on the model zoo:
##   make seeds POOL=replay-zoo-train CONFIG=data/train/zoo.yaml UNSEEN_POOL=replay-validation-six
SEEDS ?= 0 1 2
PROFILE ?=
seeds: setup
	$(if $(PROFILE),CORYPHAEUS_TRAINER_PROFILE=$(PROFILE)) $(PY) -m assets.seeds --seeds $(SEEDS) --pool $(POOL) \
		--unseen-pool $(UNSEEN_POOL) $(if $(CONFIG),--config $(CONFIG))

## Every GRPO run's curves (reward, parse failures, routing, per-worker shares), live, on http://127.0.0.1:6006.
tensorboard: setup
	$(VENV)/bin/tensorboard --logdir $${CORYPHAEUS_ARTIFACTS:-$(CURDIR)/artifacts}/training --host 127.0.0.1 --port 6006

## The test suite (offline; reads ../shared/data), on TEST_WORKERS processes (pytest-xdist; every test
## has its own tmp folder, artifacts root and Dagster instance, so they do not share files).
TEST_WORKERS ?= 2
test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS)

## Long soak / kill / browser tests, kept out of the default CI run.
test-slow: setup
	RUN_SLOW=1 $(PY) -m pytest -q -m slow

## The Dagster UI on http://127.0.0.1:3000 with this project's runs.
ui: setup
	$(VENV)/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

## The benchmarks, except the default-run one, which clones and installs the project twice (`make bench-default-run`).
bench: setup
	for b in $(filter-out default_run_benchmark,$(basename $(notdir $(wildcard benchmarks/*_benchmark.py)))); do echo "== benchmarks.$$b"; $(PY) -m benchmarks.$$b || exit 1; done

## Install, `make run` twice and `make test` from fresh clones of BASELINE and of HEAD, side by side.
BASELINE ?= 928a1c3
bench-default-run: setup
	$(PY) -m benchmarks.default_run_benchmark --baseline $(BASELINE) --current HEAD

## Re-resolve requirements.lock after a change to the dependencies in pyproject.toml; commit both.
## It resolves from scratch (newest versions pyproject.toml allows): compiling onto the old lock
## in place let its pins steer the resolver to an older release of one package.
lock: | $(UV)
	$(UV) pip compile --quiet pyproject.toml --extra dev $(LOCK_TARGET) $(UV_SOURCES) --generate-hashes \
		--custom-compile-command "make lock" -o requirements.lock.new
	mv requirements.lock.new requirements.lock

clean:
	rm -rf artifacts .dagster_home
