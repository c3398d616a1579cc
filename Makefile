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
	# Bytecode for every module, on all cores (pip compiles one file at a time: most of the
	# install's time). PYTHONDONTWRITEBYTECODE is set on some machines (CI's), so nothing
	# would be cached later. torch's one file for Python 3.12's syntax is left out, as pip leaves it.
	$(PY) -m compileall -q -j 0 -x 'torch/testing/_internal/py31[2-9]' \
		$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') >/dev/null
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
	@# The suite starts thousands of processes and none writes bytecode where PYTHONDONTWRITEBYTECODE
	@# is set (CI): compile the project's own once (Python checks each against its source: a stale one is not used).
	@$(PY) -m compileall -q -j 0 agent api broker >/dev/null
	$(PY) -m pytest

bench: install
	$(PY) bench/api_submit.py
	$(PY) bench/reconcile_pass.py

clean:
	rm -rf $(VENV) .venv-jobs build *.egg-info
