"""Who may speak on the agent's channel: every route the agent calls, with
each kind of credential. An attempt's own token only, while it runs and for
the grace window after it ended; then 410 Gone, which the agent obeys."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
from conftest import ADMIN_TOKEN
from sqlalchemy import update
from support.helpers import wait_for, wait_state

from spotbroker.broker.recovery.agent_channel import agent_token
from spotbroker.broker.store.db import make_engine, make_session_factory, transaction
from spotbroker.broker.store.models import Attempt

EVENTS, LOGS = "/v1/agent/events", "/v1/agent/logs"


def call(api, route: str, token: str | None, seq: int = 1):
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    if route == EVENTS:
        body = {"events": [{"seq": seq, "type": "heartbeat", "at": datetime.now(UTC).isoformat(), "data": {}}]}
        return api.post(route, json=body, headers=headers)
    size = api.post(route, content=b"", headers={**headers, "X-Log-Offset": "0"})
    if size.status_code != 200:
        return size
    return api.post(route, content=b"x\n", headers={**headers, "X-Log-Offset": str(size.json()["size"])})


def job_with_attempt(api, h, settings, run: str, states: set[str]) -> tuple[dict, str]:
    job_id = api.post("/v1/jobs", json={"run": run}, headers=h).json()["id"]
    job = wait_state(api, h, job_id, states, timeout=60)
    return job, agent_token(settings.signing_key(), job["attempts"][-1]["id"])


def set_ended_at(settings, attempt_id: int, ago: timedelta) -> None:
    engine = make_engine(settings.sqlalchemy_url)
    with transaction(make_session_factory(engine)) as s:
        s.execute(update(Attempt).where(Attempt.id == attempt_id).values(ended_at=datetime.now(UTC) - ago))
    engine.dispose()


@pytest.mark.parametrize("route", [EVENTS, LOGS])
def test_no_token_a_team_token_the_admin_token_or_a_forged_one_is_refused(api, team_headers, settings, route):
    h = team_headers()
    team_token = h["Authorization"].split()[1]
    for token in (None, team_token, ADMIN_TOKEN, "sba_forged", agent_token(b"another key", 1)):
        r = call(api, route, token)
        assert r.status_code == 401, (token, r.status_code)
        assert r.headers["content-type"] == "application/problem+json"
    # ... and an agent's token opens no team route.
    job, token = job_with_attempt(api, h, settings, "sleep 60", {"RUNNING"})
    assert api.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    assert api.get(f"/v1/jobs/{job['id']}", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_another_attempts_token_speaks_only_for_its_own_attempt(api, team_headers, settings):
    h, other = team_headers("a"), team_headers("b")
    mine, my_token = job_with_attempt(api, h, settings, "sleep 60", {"RUNNING"})
    theirs, their_token = job_with_attempt(api, other, settings, "sleep 60", {"RUNNING"})
    # The agent's own word that the trainer started may come after RUNNING: wait for it, so that
    # `before` holds all that my job's own agent will say while it sleeps.
    wait_for(lambda: any(e["type"] == "trainer_started" for e in
                         api.get(f"/v1/jobs/{mine['id']}/events", headers=h).json()["events"]),
             timeout=30, what="my trainer to start")
    before = api.get(f"/v1/jobs/{mine['id']}/events", headers=h).json()["events"]
    my_log = api.get(f"/v1/jobs/{mine['id']}/logs", headers=h).text
    # A notice and a checkpoint in my job's prefix, sent with the other attempt's token.
    mine_prefix = f"{settings.checkpoint_uri}/a/{mine['id']}/{mine['attempts'][-1]['id']}"
    notice = {"seq": 5_010, "type": "preemption_notice", "at": datetime.now(UTC).isoformat(), "data": {}}
    r = api.post(EVENTS, json={"events": [notice]}, headers={"Authorization": f"Bearer {their_token}"})
    assert r.status_code == 200
    ckpt = {"seq": 5_011, "type": "checkpoint_committed", "at": datetime.now(UTC).isoformat(),
            "data": {"step": 1, "uri": f"{mine_prefix}/step-000000000001"}}
    r = api.post(EVENTS, json={"events": [ckpt]}, headers={"Authorization": f"Bearer {their_token}"})
    assert r.status_code == 422
    assert call(api, LOGS, their_token).status_code == 200
    # Nothing of it reached my job: its state, events, checkpoints and log are as they were.
    assert api.get(f"/v1/jobs/{mine['id']}", headers=h).json()["state"] == "RUNNING"
    assert api.get(f"/v1/jobs/{mine['id']}/events", headers=h).json()["events"] == before
    assert api.get(f"/v1/jobs/{mine['id']}/checkpoints", headers=h).json()["checkpoints"] == []
    assert api.get(f"/v1/jobs/{mine['id']}/logs", headers=h).text.startswith(my_log)
    assert "x\n" not in api.get(f"/v1/jobs/{mine['id']}/logs", headers=h).text
    assert api.get(f"/v1/jobs/{theirs['id']}", headers=other).json()["state"] == "PREEMPTING"
    assert call(api, EVENTS, my_token, seq=5_000).status_code == 200  # mine still works for mine
    for job, headers in ((mine, h), (theirs, other)):
        api.post(f"/v1/jobs/{job['id']}/cancel", headers=headers)


@pytest.mark.parametrize("route", [EVENTS, LOGS])
def test_an_ended_attempts_token_works_for_the_grace_window_then_is_gone(api, team_headers, settings, route):
    h = team_headers()
    job, token = job_with_attempt(api, h, settings, "true", {"SUCCEEDED"})
    attempt_id = job["attempts"][-1]["id"]
    assert settings.agent_token_grace == 600  # the default
    set_ended_at(settings, attempt_id, timedelta(seconds=590))  # late words: still taken
    assert call(api, route, token, seq=1000).status_code == 200
    set_ended_at(settings, attempt_id, timedelta(seconds=610))
    r = call(api, route, token, seq=1001)
    assert r.status_code == 410, r.text
    assert r.headers["content-type"] == "application/problem+json" and r.json()["status"] == 410
    settings.agent_token_grace = 3600  # the window is a setting, read on each request
    assert call(api, route, token, seq=1002).status_code == 200
    settings.agent_token_grace = 600


def test_a_live_attempts_token_is_never_gone(api, team_headers, settings):
    h = team_headers()
    job, token = job_with_attempt(api, h, settings, "sleep 60", {"RUNNING"})
    settings.agent_token_grace = 0
    try:
        assert call(api, EVENTS, token, seq=1000).status_code == 200
        assert call(api, LOGS, token).status_code == 200
    finally:
        settings.agent_token_grace = 600
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_an_agent_whose_attempt_is_gone_stops_its_trainer_and_exits(api, team_headers, settings, tmp_path):
    """The real agent against the real broker: an attempt that ended long ago
    (its node kept running, unseen) gets 410, and its agent stops."""
    h = team_headers()
    job, token = job_with_attempt(api, h, settings, "true", {"SUCCEEDED"})
    set_ended_at(settings, job["attempts"][-1]["id"], timedelta(seconds=700))
    before = api.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["events"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    env.update(SPOTBROKER_URL=f"http://127.0.0.1:{settings.port}", SPOTBROKER_AGENT_TOKEN=token,
               SPOTBROKER_CLOUD="local")
    trainer = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(42)); time.sleep(120)"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "spotbroker.agent.cli", "run", "--work-dir", str(tmp_path / "a"),
                           "--", sys.executable, "-c", trainer], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 42, proc.stderr  # the trainer was stopped
    assert "410" in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - started < 30
    assert api.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["events"] == before  # nothing taken
