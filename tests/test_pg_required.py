"""Without PostgreSQL its half of the suite skips and says what is missing,
except under CI=true, where the run fails (a green CI never hides it)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.ports import free_port

REPO = Path(__file__).resolve().parents[1]


def run_pg_tests(ci: bool) -> subprocess.CompletedProcess[str]:
    port = free_port()  # a port where nothing listens
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["SPOTBROKER_TEST_PG_URL"] = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "tests/broker/jobs/test_states.py", "-k", "postgresql",
                           "-q", "-p", "no:cacheprovider", "-rs"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def test_without_a_server_the_postgresql_tests_skip_and_say_why():
    r = run_pg_tests(ci=False)
    assert r.returncode == 0, r.stdout
    assert "skipped" in r.stdout and "PostgreSQL is not reachable" in r.stdout
    assert "SPOTBROKER_TEST_PG_URL" in r.stdout


def test_under_ci_a_missing_server_fails_the_run():
    r = run_pg_tests(ci=True)
    assert r.returncode != 0 and "PostgreSQL is not reachable" in r.stdout
