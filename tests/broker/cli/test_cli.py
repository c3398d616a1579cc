"""The command line, run as a user runs it: a real process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import spotbroker
from support.helpers import create_pg_database, drop_pg_database
from support.ports import free_port

from spotbroker.broker.store import migrate

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    return {**clean, "HOME": str(tmp_path / "home"), "SPOTBROKER_PRICES_SOURCES": "catalog"}  # no network


def test_teams_create_prints_the_token_alone_on_the_last_line(env, tmp_path):
    r = spotbroker("teams", "create", "research", env=env)
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip().splitlines()[-1]
    assert token.startswith("sbt_") and " " not in token
    assert (tmp_path / "home" / ".spotbroker" / "spotbroker.db").exists()  # the embedded default
    r = spotbroker("teams", "create", "other", "--json", env=env)
    assert json.loads(r.stdout)["team"] == "other"
    r = spotbroker("teams", "create", "research", env=env)
    assert r.returncode == 1 and "already exists" in r.stderr and "Traceback" not in r.stderr


def test_submit_names_the_file_and_line_of_a_syntax_error(env, tmp_path):
    bad = tmp_path / "task.yaml"
    bad.write_text("name: x\nrun: echo hi\nresources:\n  accelerators: [A100\n")
    r = spotbroker("submit", str(bad), env={**env, "SPOTBROKER_TOKEN": "t"})
    assert r.returncode == 1 and f"{bad}:5" in r.stderr and "Traceback" not in r.stderr
    r = spotbroker("submit", str(tmp_path / "missing.json"), env={**env, "SPOTBROKER_TOKEN": "t"})
    assert r.returncode != 0 and "Traceback" not in r.stderr


def test_client_commands_explain_an_unreachable_broker(env):
    r = spotbroker("jobs", env={**env, "SPOTBROKER_TOKEN": "t", "SPOTBROKER_URL": "http://127.0.0.1:9"})
    assert r.returncode == 1 and "cannot reach the broker" in r.stderr and "Traceback" not in r.stderr
    assert "http://127.0.0.1:9 (SPOTBROKER_URL)" in r.stderr        # where the address came from
    r = spotbroker("jobs", env=env)
    assert r.returncode == 1 and "SPOTBROKER_TOKEN" in r.stderr


def test_serve_prints_the_address_clients_export(env):

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "spotbroker.broker.cli", "serve", "--host", "0.0.0.0",
                             "--port", str(port)], env={**env, "SPOTBROKER_ADMIN_TOKEN": "x" * 32},
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    import threading

    stop = threading.Timer(60, proc.terminate)  # a banner without the line must not hang the test
    stop.start()
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if "SPOTBROKER_URL" in line or len(lines) > 50:
                break
    finally:
        stop.cancel()
        proc.terminate()
        proc.wait(timeout=30)
        proc.stderr.close()
    # A wildcard address is where it listens, not where a client connects.
    assert f"export SPOTBROKER_URL=http://127.0.0.1:{port}\n" in lines[-1], lines


def test_serve_refuses_a_postgresql_database_that_is_behind(env, pg_server):
    url = create_pg_database("spotbroker_behind")
    try:
        r = spotbroker("serve", "--port", "0", env={**env, "SPOTBROKER_DATABASE_URL": url})
        assert r.returncode == 1 and "spotbroker db upgrade" in r.stderr and "Traceback" not in r.stderr
        head = migrate.head_revision()
        r = spotbroker("db", "upgrade", env={**env, "SPOTBROKER_DATABASE_URL": url})
        assert r.returncode == 0 and head in r.stdout
        r = spotbroker("db", "current", env={**env, "SPOTBROKER_DATABASE_URL": url})
        assert f"database: {head}" in r.stdout
    finally:
        drop_pg_database(url)


def test_help_lists_every_command_fast(env):
    r = spotbroker("--help", env=env)
    for name in ("serve", "db", "teams", "submit", "jobs", "job", "logs", "cancel", "demo", "simulate", "agent",
                 "alerts", "silences", "budget", "costs", "prices"):
        assert f"  {name} " in r.stdout


def test_demo_runs_end_to_end(env, tmp_path):
    r = spotbroker("demo", env=env, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "preemption notice" in out and "checkpoint committed" in out and "trainer resumed from step" in out
    assert "steps lost: 0" in out and "(equal)" in out and "SUCCEEDED after 2 attempts" in out


def test_user_files_named_agent_and_api_do_not_shadow_the_package(tmp_path):
    """Users' projects often hold their own agent.py or api/: ours live under spotbroker."""
    (tmp_path / "agent.py").write_text("raise SystemExit('the user agent.py was imported')\n")
    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "__init__.py").write_text("raise SystemExit('the user api/ was imported')\n")
    (tmp_path / "broker.py").write_text("raise SystemExit('the user broker.py was imported')\n")
    code = ("import spotbroker.agent.protocol, spotbroker.api.app, spotbroker.broker.reconciler, sys;"
            "import agent, api, broker")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    # Ours imported fine; then the user's own modules were found, as they should be.
    assert "the user agent.py was imported" in r.stderr


def test_job_shows_a_tenants_output_and_reasons_without_their_control_characters(capsys):
    """A failed pre-flight's tail is the trainer's output: its escape sequences
    reached the operator's terminal through `spotbroker job ID` (and a reason
    or an event quoting it, through `job` and `jobs`)."""
    from spotbroker.broker.cli.jobs import print_job, short_reason

    evil = "boom\x1b]0;owned\x07\x1b[2J\rover\x9b31m [bold]x[/]\nnext line"
    attempt = {"id": 7, "preflight": True, "state": "FAILED", "reason": evil, "cloud": "aws", "region": "us-east-1",
               "zone": None, "zone_id": None, "instance_type": "m5.large", "use_spot": True, "price_per_hour": 0.1,
               "started_at": None, "ended_at": None, "cost": 0.0}
    job = {"id": 3, "name": "pf", "state": "FAILED", "reason": f"preflight_failed: {evil}", "cost": 0.0,
           "attempts": [attempt], "preflight": {"status": "failed", "why": evil, "tail": evil}}
    events = [{"at": "2026-11-28T10:00:00.000", "type": "preflight_failed", "attempt_id": 7,
               "data": {"why": evil, "tail": evil}}]
    print_job(job, events)
    shown = capsys.readouterr().out + short_reason(job)
    assert not {"\x1b", "\x07", "\x9b", "\r"} & set(shown), repr(shown)
    assert "boom\\x1b]0;owned\\x07\\x1b[2J\\x0dover\\x9b31m [bold]x[/]" in shown  # escaped, and no markup of its own
    assert "next line" in shown
