# The two commands: `make run` (the platform on embedded defaults) and `make test`.
# Both create the virtual environment and install everything on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
# The swift backend trains in an environment of its own (ms-swift pins trl<1.0, datasets<4.8.5).
SWIFT_VENV ?= .venv-swift
export DJANGO_SETTINGS_MODULE ?= webapp.settings

.PHONY: install swift-env run demo test test-fast warm-models bench chromium jail clean

install: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements.txt
	touch $@

## The swift backend's environment: torch first, then ms-swift with its own pins.
swift-env: $(SWIFT_VENV)/.installed

$(SWIFT_VENV)/.installed: requirements-swift.txt
	python3 -m venv $(SWIFT_VENV)
	$(SWIFT_VENV)/bin/python -m pip install -q --upgrade pip
	$(SWIFT_VENV)/bin/python -m pip install -q torch==2.13.0
	$(SWIFT_VENV)/bin/python -m pip install -q -r requirements-swift.txt
	touch $@

## The platform, embedded: SQLite, no servers; starts web + worker and a demo run. Never as root:
## run by root, it first makes the unprivileged user the platform's processes become.
run: install jail
	bash scripts/service_user.sh $(PY)
	$(PY) manage.py platform

## The library alone: train the multi-turn example in the terminal until reward passes 0.9.
demo: install
	$(PY) -m training demo

## The learning tests' warm-started tiny models (tests/training/warm_start.py), made anew by running every
## test that asks for one, then kept in tests/fixtures/warm-models (committed): exactly those the suite asks for.
WARM_MODEL_TESTS := $(shell grep -l warm_tiny_model tests/training/test_*.py)
warm-models: install
	bash scripts/services.sh
	rm -rf var/test-cache/warm-models
	WARM_MODELS_COMMITTED=0 DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test} \
	REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/0} $(PYTEST) $(WARM_MODEL_TESTS)
	rm -rf tests/fixtures/warm-models
	cp -r var/test-cache/warm-models tests/fixtures/warm-models

## The tests, against this machine's PostgreSQL and Redis (started if they are down), in four
## processes (pytest-xdist) on two cores: a test that waits on its servers, workers or browser
## leaves the CPU to the others (-n 2 left the cores idle for a third of the run). Each process is a platform of its own: its own test database
## (pytest-django), Redis database and var folder (tests/platform_slots.py), so the servers,
## Celery workers and browsers one process starts never see the other's runs.
PYTEST := PYTHONPATH=tests $(PY) -m pytest -p platform_slots -n 4 --dist worksteal
test: install swift-env chromium jail
	bash scripts/services.sh
	$(VENV)/bin/lint-imports  # the floors (pyproject.toml: [tool.importlinter])
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test} \
	REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/0} \
	$(PYTEST) tests

## The edit loop: no browser, no training that must show learning, no fault injection.
test-fast: install jail
	bash scripts/services.sh
	$(VENV)/bin/lint-imports
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test} \
	REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/0} \
	$(PYTEST) -m "not browser and not slow" --ignore=tests/reliability tests

bench: install
	$(PY) bench/train_overhead.py
	bash scripts/services.sh
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/dashboard_bench} \
	REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/0} \
	$(PY) bench/dashboard.py

## Headless Chromium for the browser tests, from Debian's packages.
chromium:
	@test -x /usr/bin/chromium || (apt-get update -q && apt-get install -y -q chromium chromium-driver)

## bubblewrap: the jail that model-written code and the platform's run checks run in (training/isolation/jail.py).
jail:
	@test -x /usr/bin/bwrap || (apt-get update -q && apt-get install -y -q bubblewrap)

clean:
	rm -rf $(VENV) $(SWIFT_VENV) runs var
