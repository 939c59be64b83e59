# The README's two commands are `make run` and `make test`; both set up .venv once and reuse it.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# Runs land in the project's own Dagster instance, so `make ui` shows them afterwards.
export DAGSTER_HOME := $(CURDIR)/.dagster_home

.PHONY: setup run test test-slow ui bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

setup: $(VENV)/.installed
	mkdir -p $(DAGSTER_HOME)
	test -f $(DAGSTER_HOME)/dagster.yaml || cp data/dagster.yaml $(DAGSTER_HOME)/dagster.yaml

## Materialize the whole asset graph on the embedded default pool, headless, and print the headline tables.
run: setup
	$(PY) -m assets.main

## The test suite (offline; reads ../shared/data).
test: setup
	$(PY) -m pytest -q

## Long soak / kill / browser tests, kept out of the default CI run.
test-slow: setup
	RUN_SLOW=1 $(PY) -m pytest -q -m slow

## The Dagster UI on http://127.0.0.1:3000 with this project's runs.
ui: setup
	$(VENV)/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

bench: setup
	for b in benchmarks/*_benchmark.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf artifacts .dagster_home
