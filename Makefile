# Entry points on a fresh machine: `make demo` (the main job), `make check` (the fast tier: lint,
# format, types and every test that starts no process, under 2 minutes) and `make test` (the
# whole suite, with coverage). All build .venv idempotently: the CPU torch pin first, so the
# project's torch>= is already met.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The browser tests drive Debian's Chromium through Playwright (never `playwright install`,
# which downloads a browser). Installed here when missing; fonts-dejavu-core so that text does
# not render as boxes (chromium only recommends a font).
CHROMIUM ?= /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# The multi-host tests (tests/multihost, root only) run an OpenSSH server in each simulated
# host's network namespace (iproute2). Installed here when missing; where systemd runs, apt
# also starts the system's ssh service, which the tests never use.
SSHD ?= /usr/sbin/sshd
# The Slurm tests (tests/multihost/test_slurm.py) run slurmctld, a slurmd in each simulated host
# and munged, all started and stopped by the harness with their own configuration and key
# (where systemd runs, apt may also start the system's munge and slurm services; never used).
SLURMD ?= /usr/sbin/slurmd
# The MPI launcher test (tests/multihost/test_mpi.py) starts engines through Open MPI's mpiexec.
MPIEXEC ?= /usr/bin/mpiexec
# The JupyterHub test (tests/test_jupyterhub.py, root only): the Hub's proxy, configurable-http-proxy,
# from the npm registry into .hub/ (ignored; node and npm from apt when missing), and setfacl
# (Debian's acl), with which the test lets its two users reach a venv interpreter under a 0700 home.
HUB_PROXY := .hub/node_modules/.bin/configurable-http-proxy
HUB_PROXY_VERSION := 5.3.0
SETFACL ?= /usr/bin/setfacl

# The tests that start processes carry one of these markers (tests/conftest.py); the fast tier
# deselects them, and under that selection starting such a process fails the test.
FAST := not (cluster or kernel or ranks or subprocess or browser or multihost or mpi or slurm or hub)

.PHONY: venv browser multihost slurm mpi hub check test screenshots demo lab docs tutorials

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,browser,demo,mixle,dev,docs,hub]'
	rm -f $(VENV)/.installed-*; touch $@

browser: $(CHROMIUM)

$(CHROMIUM):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core

multihost: $(SSHD)

$(SSHD):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssh-server iproute2

slurm: $(SLURMD)

$(SLURMD):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge

mpi: $(MPIEXEC)

$(MPIEXEC):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openmpi-bin

hub: $(HUB_PROXY) $(SETFACL)

$(HUB_PROXY):
	command -v npm >/dev/null || { $(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm; }
	npm install --prefix .hub --no-save --no-audit --no-fund --loglevel=error configurable-http-proxy@$(HUB_PROXY_VERSION)

$(SETFACL):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends acl

# The type checker runs beside the tests (one core each); its report comes when it ends.
check: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy & types=$$!; \
	OMP_NUM_THREADS=1 MIXLE_STRICT=1 $(PY) -m pytest -q -p no:cacheprovider -m "$(FAST)"; tests=$$?; \
	wait $$types; types_rc=$$?; test $$tests -eq 0 && test $$types_rc -eq 0

# The whole suite in two lanes, one per core: the tests that mostly wait on other programs
# (SIDE: the simulated hosts' sshd, Slurm and MPI; the suites of scikit-learn and hmmlearn and
# the docs build in subprocesses; JupyterLab and the built site in Chromium; the JupyterHub; and,
# marked side_lane, the longest teaching notebook, which balances the lanes) beside all the
# others. Coverage of mixle_nb's lines in every process either lane starts (engines, kernels,
# ranks: see [tool.coverage.run] in pyproject.toml) is combined at the end; below
# [tool.coverage.report] fail_under, it fails, as does a failure in either lane. The numba
# kernels are compiled into their disk cache first (tests/compile_kernels.py), once, rather than
# by the first processes of both lanes at once.
SIDE := multihost or mpi or slurm or subprocess or browser or hub or side_lane
TEST_ENV := OMP_NUM_THREADS=1 MIXLE_STRICT=1 MIXLE_CHROMIUM=$(CHROMIUM)
SIDE_LOG := .side-lane.log

test: venv browser multihost slurm mpi hub
	rm -f .coverage .coverage.* $(SIDE_LOG)
	$(TEST_ENV) $(PY) tests/compile_kernels.py
	$(TEST_ENV) $(PY) -m coverage run -m pytest -q -p no:cacheprovider -m "$(SIDE)" --durations=10 > $(SIDE_LOG) 2>&1 & side=$$!; \
	$(TEST_ENV) $(PY) -m coverage run -m pytest -q -m "not ($(SIDE))" --durations=25; main=$$?; \
	wait $$side; side_rc=$$?; echo "=== beside it, the tests marked $(SIDE):"; cat $(SIDE_LOG); \
	$(PY) -m coverage combine -q && $(PY) -m coverage report; cov=$$?; \
	test $$main -eq 0 && test $$side_rc -eq 0 && test $$cov -eq 0

# The docs' pictures the browser tests take (docs/_static/site_*.png and hmm_panel_browser.png),
# rewritten only here: `make test` writes them into tests/browser/artifacts/pictures/ (ignored).
SCREENSHOT_TESTS := tests/browser/test_docs_site_pages.py tests/browser/test_hmm_panel_browser.py

screenshots: venv browser
	$(TEST_ENV) MIXLE_UPDATE_SCREENSHOTS=1 $(PY) -m pytest -q -p no:cacheprovider $(SCREENSHOT_TESTS)

demo: venv
	$(PY) -m mixle_nb.demo

lab: venv
	$(PY) -m jupyterlab $(ALLOW_ROOT) notebooks/

# The documentation site, from this repository only (no network): warnings are errors, cross-
# references nitpicky. Open docs/_build/html/index.html.
docs: venv
	$(PY) -m sphinx -E -W --keep-going -n -b html docs docs/_build/html

# The executed copies of the teaching notebooks that the site's Tutorials show (a few minutes).
tutorials: venv
	$(PY) docs/refresh_tutorials.py
