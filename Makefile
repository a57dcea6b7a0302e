# Two commands do all the setup on a new machine:
#   make demo   runs the product        make test   runs the whole test suite
# Both create .venv and install from pyproject.toml when needed.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test demo bench worker sweep clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

demo: $(STAMP)
	$(PY) manage.py demo

bench: $(STAMP)
	$(PY) bench/engine.py

worker: $(STAMP)
	$(PY) manage.py sagas_worker

sweep: $(STAMP)
	$(PY) manage.py sagas_sweep --loop

clean:
	rm -rf $(VENV) .run .pytest_cache *.egg-info
