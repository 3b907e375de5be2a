# LabPortal: the two commands a newcomer needs are `make demo` and `make test`.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test install assets lint typecheck bench messages clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "LabPortal needs $(PYTHON) (Python 3.11+). Install it, or run: make PYTHON=python3 ..."; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) assets

# htmx comes from the npm registry; the portal serves it itself (no CDN).
assets: node_modules/htmx.org/dist/htmx.min.js
node_modules/htmx.org/dist/htmx.min.js: package.json
	@command -v npm >/dev/null || { echo "LabPortal installs htmx with npm: install Node.js and npm (apt-get install npm)."; exit 1; }
	npm install --no-audit --no-fund --silent
	touch $@

demo: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo
	$(PY) manage.py rundemo

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy .

bench: install
	$(PY) -m scheduler.bench
	$(PY) -m scheduler.simulate --trace ../shared/traces/alibaba2023_openb_gpu.csv --gpus 32 --gpus-per-node 8 --policy all --users 30 --seed 1

messages: install
	cd . && $(PY) manage.py makemessages -l zh_Hans --ignore=.venv --ignore=node_modules --ignore=var
	$(PY) manage.py compilemessages --ignore=.venv --ignore=node_modules

clean:
	rm -rf var $(VENV) node_modules
