# Two entry points on a fresh machine: `make demo` (the main job) and `make test` (the suite).
# Both build .venv idempotently: the CPU torch pin first, so the project's torch>= is already met.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: venv test demo lab

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	rm -f $(VENV)/.installed-*; touch $@

test: venv
	OMP_NUM_THREADS=1 $(PY) -m pytest -q

demo: venv
	$(PY) -m mixle_nb.demo

lab: venv
	$(PY) -m jupyterlab notebooks/
