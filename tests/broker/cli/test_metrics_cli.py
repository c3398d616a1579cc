"""`spotbroker metrics ID` and the early stop under `spotbroker job ID`,
run as a user runs them against a real server."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from conftest import ADMIN_TOKEN
from support.cli import spotbroker
from support.helpers import counted, post, team_token, wait_state

from spotbroker.broker.recovery.agent_channel import agent_token

RULE = {"metric": "val_loss", "patience": 1, "min_delta": 0.0, "min_steps": 0}


def test_metrics_prints_the_series_and_the_early_stop(api, env, settings):
    token = team_token(api, "ml", ADMIN_TOKEN)
    h = {"Authorization": f"Bearer {token}"}
    job_id = api.post("/v1/jobs", json={"run": "sleep 60", "early_stop": RULE}, headers=h).json()["id"]
    job = wait_state(api, h, job_id, {"RUNNING"}, timeout=60)
    agent = agent_token(settings.signing_key(), job["attempts"][-1]["id"])
    t0 = datetime.now(UTC)
    run: dict = {}
    post(api, agent, *[{"seq": 100 + i, "type": "metrics", "at": (t0 + timedelta(seconds=5 * i)).isoformat(),
                        "data": counted(RULE, run, {"step": 10 * (i + 1), "values": {"val_loss": v, "acc": 0.5}})}
                       for i, v in enumerate([2.0, 1.0, 1.5])])
    mine = {**env, "SPOTBROKER_TOKEN": token}

    r = spotbroker("metrics", str(job_id), "--json", env=mine)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == api.get(f"/v1/jobs/{job_id}/metrics", headers=h).json()
    r = spotbroker("metrics", str(job_id), env=mine)
    assert r.returncode == 0, r.stderr
    assert "VAL_LOSS" in r.stdout and "1.5" in r.stdout
    assert "early stop on val_loss: best 1 at step 20" in r.stdout
    r = spotbroker("job", str(job_id), env=mine)
    assert "early stop on val_loss" in r.stdout

    other = {**env, "SPOTBROKER_TOKEN": team_token(api, "cv", ADMIN_TOKEN)}
    r = spotbroker("metrics", str(job_id), env=other)
    assert r.returncode == 1 and "no job" in r.stderr and "Traceback" not in r.stderr
    api.post(f"/v1/jobs/{job_id}/cancel", headers=h)
