# LabPortal: the two commands a newcomer needs are `make demo` and `make test`.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
UV     := $(VENV)/bin/uv
PYTEST_ARGS ?=
# Tests spread over one xdist worker per core; those that share one of the machine's services
# (the private Slurm, Redis's queues, Docker, real worker/agent processes) stay on one worker
# (tests/conftest.py puts them in one xdist group). PYTEST_WORKERS=0 runs them all in-process.
PYTEST_WORKERS ?= auto

# Python caches bytecode (in .venv and the checkout's __pycache__/ folders, which git ignores)
# for these commands even where the environment sets PYTHONDONTWRITEBYTECODE: uv installs
# without compiling (pip compiled at install time, a minute here), and without the caches
# each of the demo's processes and each test worker would compile Django and the libraries
# again at every start.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test install assets lock lock-upgrade lock-check lint typecheck bench bench-json messages clean

# The portal with the test and report extras, the agent and labctl (distributions of their
# own: distributions/agent, distributions/labctl), all editable. The libraries come from the
# lock, hash-checked (requirements/dev.txt, made by `make lock`): uv first, with pip, from
# requirements/uv.txt, then the rest with uv, which removes whatever the lock does not
# name; then the three local distributions without dependencies. A new top-level package
# needs a fresh editable install to be importable by the console scripts.
$(STAMP): pyproject.toml distributions/agent/pyproject.toml distributions/labctl/pyproject.toml requirements/dev.txt requirements/dev-base.txt requirements/ldap.txt requirements/uv.txt $(wildcard */__init__.py)
	@command -v $(PYTHON) >/dev/null || { echo "LabPortal needs $(PYTHON) (Python 3.11+). Install it, or run: make PYTHON=python3 ..."; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes --no-deps -r requirements/uv.txt
	$(UV) pip sync --quiet --python $(PY) --require-hashes requirements/dev-base.txt
	@if command -v cc >/dev/null && [ -f /usr/include/ldap.h ] && [ -f /usr/include/sasl/sasl.h ]; then \
	  $(UV) pip install --quiet --python $(PY) --require-hashes -r requirements/ldap.txt; \
	else \
	  echo "LDAP sign-in's python-ldap not installed (it builds from source: apt-get install gcc libldap2-dev libsasl2-dev, then make install); everything else works without it."; \
	fi
	$(UV) pip install --quiet --python $(PY) --no-deps -e . -e ./distributions/agent -e ./distributions/labctl
	touch $(STAMP)

# The locks under requirements/ (deploy/lockfile.py): `make lock` after a change to a
# pyproject.toml's dependencies keeps every other pin; `make lock-upgrade` takes the newest
# releases within the ranges. `make lock-check` (run early by .ci/run) fails on a stale lock.
lock: $(STAMP)
	$(PY) deploy/lockfile.py compile --uv $(UV)

lock-upgrade: $(STAMP)
	$(PY) deploy/lockfile.py compile --upgrade --uv $(UV)

lock-check:
	@command -v $(PYTHON) >/dev/null || { echo "lock-check needs $(PYTHON), or run: make PYTHON=python3 lock-check"; exit 1; }
	$(PYTHON) deploy/lockfile.py check

install: $(STAMP) assets

# htmx and uPlot come from the npm registry; the portal serves them itself (no CDN).
ASSETS := node_modules/htmx.org/dist/htmx.min.js node_modules/uplot/dist/uPlot.iife.min.js node_modules/@xterm/xterm/lib/xterm.js
assets: $(ASSETS)
$(ASSETS): package.json
	@command -v npm >/dev/null || { echo "LabPortal installs htmx with npm: install Node.js and npm (apt-get install npm)."; exit 1; }
	npm install --no-audit --no-fund --silent
	touch $@

# migrate runs Django's system checks; the commands after it skip them (a second each).
demo: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo --skip-checks
	$(PY) manage.py seed_demo_history --skip-checks
	$(PY) manage.py rundemo --skip-checks

test: install
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy .

# The engine's speed and quality against its baselines, then the portal's submit
# throughput and time to start, then telemetry: ingest, rollup of a day for 1,024 GPUs,
# /metrics, a year of chart data (these need PostgreSQL: BENCH_DATABASE_URL).
BENCH_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/labportal
BENCH_BROKER_URL ?= redis://127.0.0.1:6379/0
bench: install
	$(PY) -m benchmarks.scheduler --pending 10000 --gpus 1024 --reservations 200 --quality --held-out --sim-speed
	$(PY) -m benchmarks.scheduler_shape
	DATABASE_URL=$(BENCH_DATABASE_URL) CELERY_BROKER_URL=$(BENCH_BROKER_URL) $(PY) -m benchmarks.portal
	DATABASE_URL=$(BENCH_DATABASE_URL) CACHE_URL=$(BENCH_BROKER_URL) $(PY) -m benchmarks.telemetry
	DATABASE_URL=$(BENCH_DATABASE_URL) $(PY) -m benchmarks.metrics
	DATABASE_URL=$(BENCH_DATABASE_URL) $(PY) -m benchmarks.alerts
	DATABASE_URL=$(BENCH_DATABASE_URL) $(PY) -m benchmarks.slurm
	DATABASE_URL=$(BENCH_DATABASE_URL) $(PY) -m benchmarks.slurm_accounting
	$(PY) -m benchmarks.gateway
	DATABASE_URL=$(BENCH_DATABASE_URL) CELERY_BROKER_URL=$(BENCH_BROKER_URL) $(PY) -m benchmarks.joblogs
	DATABASE_URL=$(BENCH_DATABASE_URL) CELERY_BROKER_URL=$(BENCH_BROKER_URL) $(PY) -m benchmarks.sessions

bench-json: install
	$(PY) -m benchmarks.scheduler --pending 10000 --gpus 1024 --reservations 200 --json
	$(PY) -m benchmarks.scheduler_shape --json
	DATABASE_URL=$(BENCH_DATABASE_URL) CELERY_BROKER_URL=$(BENCH_BROKER_URL) $(PY) -m benchmarks.portal --json
	DATABASE_URL=$(BENCH_DATABASE_URL) CACHE_URL=$(BENCH_BROKER_URL) $(PY) -m benchmarks.telemetry --json
	DATABASE_URL=$(BENCH_DATABASE_URL) $(PY) -m benchmarks.metrics --json
	DATABASE_URL=$(BENCH_DATABASE_URL) $(PY) -m benchmarks.alerts --json
	DATABASE_URL=$(BENCH_DATABASE_URL) $(PY) -m benchmarks.slurm --json
	DATABASE_URL=$(BENCH_DATABASE_URL) $(PY) -m benchmarks.slurm_accounting --json
	$(PY) -m benchmarks.gateway --json
	DATABASE_URL=$(BENCH_DATABASE_URL) CELERY_BROKER_URL=$(BENCH_BROKER_URL) $(PY) -m benchmarks.joblogs --json
	DATABASE_URL=$(BENCH_DATABASE_URL) CELERY_BROKER_URL=$(BENCH_BROKER_URL) $(PY) -m benchmarks.sessions --json

messages: install
	cd . && $(PY) manage.py makemessages -l zh_Hans --ignore=.venv --ignore=node_modules --ignore=var
	$(PY) manage.py compilemessages --ignore=.venv --ignore=node_modules

clean:
	rm -rf var $(VENV) node_modules
