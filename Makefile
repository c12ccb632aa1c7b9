# Quick start: `make run` (embedded: SQLite, no Redis) and `make test` (PostgreSQL + Redis).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Two install sets: what running needs (`make run`: the project alone) and what developing needs
# (`make test` and its parts: test, lint, typing and browser tools, the client). The dev stamp
# keeps its name: scripts wait for it.
RUN_STAMP := $(VENV)/.run-stamp
STAMP := $(VENV)/.installed-stamp

# The suite's services (started by .ci/run when installed but stopped).
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/agent_console
TEST_REDIS_URL ?= redis://127.0.0.1:6379/15

.PHONY: install install-run lock run demo schema screenshot client test lint typecheck pytest pytest-embedded bench simulate soak clean

# What running needs comes from the lock file (requirements/lock.txt: every package pinned with
# its hashes, as the image installs it), then the project itself without resolving again.
LOCK := requirements/lock.txt

$(RUN_STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --require-hashes --no-deps -r $(LOCK)
	$(PY) -m pip install -q --no-deps -e .
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP) pyproject.toml client/pyproject.toml
	$(PY) -m pip install -q -e '.[dev]' -e './client[pydantic-ai,langgraph,openai-agents]'
	touch $(STAMP)

install: $(STAMP)

# The lock file from pyproject.toml's dependencies with the s3 and otel extras (the image's
# set), for Python 3.11 on every platform, with hashes; run after changing a dependency
# (tests/system/test_lock_file.py fails while they disagree).
lock: $(RUN_STAMP)
	$(PY) -m pip install -q "uv>=0.13,<0.14"
	$(VENV)/bin/uv pip compile pyproject.toml --extra s3 --extra otel --universal \
	  --python-version 3.11 --generate-hashes --custom-compile-command "make lock" -o $(LOCK)

install-run: $(RUN_STAMP)

# Only what running needs (tests/system/test_install_sets.py keeps the test tools out of it).
run: install-run
	$(PY) manage.py migrate --noinput
	$(PY) manage.py runstack

# The demo story (docs/operations.md#the-demo-story): the stack `make run` starts, kept busy by a
# scripted agent through the Python client (refunds to approve, a flaky call, an unresolved
# notification, a checked report, a budget running low), a pass every DEMO_INTERVAL seconds.
DEMO_INTERVAL ?= 30
demo: install-run
	$(PY) -m pip install -q -e ./client
	$(PY) manage.py migrate --noinput
	$(PY) manage.py demo --with-stack --interval $(DEMO_INTERVAL)

# The committed API reference, docs/openapi.yaml, from the code (tests/system/test_openapi_file.py
# fails when they differ).
schema: install-run
	$(PY) manage.py spectacular --file docs/openapi.yaml --validate --fail-on-warn

# The README's picture (docs/img/console.png) from tests/browser/test_readme_picture.py, which
# checks the page shows what the caption says; needs PostgreSQL, as `make test` does.
screenshot: install
	UPDATE_SCREENSHOT=1 DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) PYTHONPATH=. \
	  $(VENV)/bin/pytest -p tests.xdist_env -q -p no:cacheprovider tests/browser/test_readme_picture.py

# The Python client's generated part (client/agent_console_client/_generated: models, every
# route's verb, the sync twin by unasync) from docs/openapi.yaml; run after `make schema`
# (tests/client/test_client_drift.py fails when they differ).
client: install
	$(PY) client/generate.py

# ruff (PLC0415 refuses function-level imports) and the import contract: no cycles, the domain
# never imports the console, nothing imports the worker (tests/layers.py).
lint: install
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(PY) -m tests.layers

typecheck: install
	$(VENV)/bin/mypy runtime console client/agent_console_client

# PYTEST_WORKERS processes share the suite, a file at a time (a module's fixtures stay in one
# process); each has its own test database (pytest-django's _gw<N>) and Redis database
# (tests/xdist_env.py, loaded before the settings are read). PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
pytest: install
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) PYTHONPATH=. \
	  $(VENV)/bin/pytest -p tests.xdist_env -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The API and the runtime once more on the embedded database (SQLite, no Redis), the mode users
# meet first; tests that need PostgreSQL's row locks or real workers are left to the pass above.
# Shared by PYTEST_WORKERS processes as well, each with its own SQLite test database.
pytest-embedded: install
	env -u DATABASE_URL -u REDIS_URL PYTHONPATH=. $(VENV)/bin/pytest tests/api tests/runtime \
	  -p tests.xdist_env -n $(PYTEST_WORKERS) --dist loadfile \
	  -m "not postgres and not workers and not browser and not system" $(PYTEST_EMBEDDED_ARGS)

test: lint typecheck pytest pytest-embedded

# The benchmark (docs/benchmark.md): the one-operation path over HTTP on the stack `make run`
# starts, beside plain Celery and DBOS with the same processes, on its own database
# (agent_console_bench on the same server) and a Redis server it starts for itself (the URL
# below is the fallback and the model for its persistence); BENCH_QUICK=1 runs every part small.
BENCH_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/agent_console_bench
BENCH_REDIS_URL ?= redis://127.0.0.1:6379/3
BENCH_STAMP := $(VENV)/.bench-stamp

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: install $(BENCH_STAMP)
	DATABASE_URL=$(BENCH_DATABASE_URL) REDIS_URL=$(BENCH_REDIS_URL) $(PY) deploy/bench.py

# The seeded simulation (docs/simulation.md) on its own database (agent_console_sim, created and
# migrated by the command); DB=sqlite runs it on the embedded database under var/simulation.
# It prints its time and steps per second. CATCH=20 runs every plant (or PLANT's) over 20
# random seeds (or SEEDS=1,2,3) and prints each one's catch rate within STEPS.
SIM_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/agent_console_sim
SEED ?= 1
STEPS ?= 1000
PLANT ?=
SCHEDULE ?=
CATCH ?= 0
SEEDS ?=
SIM_ARGS = --seed $(SEED) --steps $(STEPS) --plant "$(PLANT)" --schedule "$(SCHEDULE)" \
	--catch-rate $(CATCH) --seeds "$(SEEDS)"

simulate: install
ifeq ($(DB),sqlite)
	env -u DATABASE_URL -u REDIS_URL CONSOLE_DATA_DIR=var/simulation $(PY) manage.py simulate $(SIM_ARGS)
else
	env -u REDIS_URL DATABASE_URL=$(SIM_DATABASE_URL) $(PY) manage.py simulate $(SIM_ARGS)
endif

# The kill soak (docs/soak.md): SOAK_OPS mixed operations against a PostgreSQL cluster and a
# Redis it starts for itself, while it kills worker children and restarts both; prints one line.
SOAK_OPS ?= 300
SOAK_SEED ?= 1

soak: install
	$(PY) deploy/soak.py --ops $(SOAK_OPS) --seed $(SOAK_SEED)

clean:
	rm -rf $(VENV) var .mypy_cache .ruff_cache .pytest_cache
