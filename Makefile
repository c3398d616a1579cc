# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test install job-user services bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is the user's own in production; the demo and tests use the CPU build.
	$(PY) -m pip install -q --no-compile -e '.[broker,plot,test]' 'torch==2.13.0'
	# Bytecode: compiling all 17,000 installed modules was two thirds of the install's CPU.
	# The broker's processes write their own on first import; local jobs run as users who
	# cannot write here, so compile what a job imports (torch, numpy, the agent's needs;
	# torch's files for a newer Python are left out).
	$(PY) -m compileall -q -j 0 -x 'py31[2-9]' $$($(PY) -c 'import os, torch, numpy; print(*(os.path.dirname(m.__file__) for m in (torch, numpy)))') >/dev/null
	$(PY) -c 'import httpx, click, obstore, pynvml, spotbroker.agent.cli, spotbroker.agent.checkpoint'
	touch $(STAMP)

install: $(STAMP) job-user

# As root, local jobs run as unprivileged uids, one per team (see README): let them use the venv.
job-user: $(STAMP)
	@scripts/ensure-job-user $(VENV)

demo: install
	$(VENV)/bin/spotbroker demo

# PostgreSQL must be up for the suite (it runs every database test on both).
services:
	@scripts/ensure-postgres

test: install services
	@scripts/ensure-chromium
	@scripts/ensure-azurite
	@scripts/ensure-kubectl $(PY)
	$(PY) -m pytest

bench: install
	$(PY) bench/api_submit.py
	$(PY) bench/reconcile_pass.py

clean:
	rm -rf $(VENV) .venv-jobs build *.egg-info
