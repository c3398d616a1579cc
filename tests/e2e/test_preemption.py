"""The whole story on one machine: a training run on a (simulated) spot
offer gets a preemption notice through the metadata simulator, the agent has
the trainer flush its checkpoint, the broker resumes the job on the next best
offer from that checkpoint, and the run ends with the same loss as an
uninterrupted one."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import once_per_run, timeline, wait_for, wait_state

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TRAIN_ARGS = ["--steps", "60", "--seed", "3", "--every-steps", "1000", "--log-every", "1"]
TRAIN = [sys.executable, str(REPO / "examples" / "train.py"), *TRAIN_ARGS]  # here, uninterrupted
# As a job: `python` is the jobs' interpreter (see the README), found on the job's PATH.
JOB_TRAIN = ["python", str(REPO / "examples" / "train.py"), *TRAIN_ARGS]


def final_loss(text: str) -> str:
    return re.findall(r"final_loss=(\S+)", text)[-1]


@pytest.fixture(scope="module")
def uninterrupted_loss(tmp_path_factory) -> str:
    """TRAIN's final loss, never stopped: one run for every test here (a torch start each)."""
    def run() -> str:
        uninterrupted = subprocess.run(TRAIN, capture_output=True, text=True, timeout=120)
        assert uninterrupted.returncode == 0, uninterrupted.stderr
        return final_loss(uninterrupted.stdout)

    return once_per_run(tmp_path_factory, "preemption-loss", run)


def test_preempted_run_resumes_elsewhere_from_its_flushed_checkpoint(api, team_headers, uninterrupted_loss):
    h = team_headers()
    run = " ".join(JOB_TRAIN + ["--step-seconds", "0.15"])
    job_id = api.post("/v1/jobs", json={"name": "train", "run": run, "max_restarts": 0,
                                        "resources": {"accelerators": "T4:1"}}, headers=h).json()["id"]
    wait_state(api, h, job_id, {"RUNNING"}, timeout=60)
    # Preempt once the trainer is stepping (its output reaches us through the agent).
    wait_for(lambda: "step=5 " in api.get(f"/v1/jobs/{job_id}/logs", headers=h).text, timeout=60,
             what="training to be under way")
    r = api.post(f"/v1/jobs/{job_id}/simulate-preemption", headers=h)
    assert r.status_code == 202, r.text

    job = wait_state(api, h, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    assert job["state"] == "SUCCEEDED", job
    first, second = job["attempts"]
    assert (first["state"], first["reason"]) == ("PREEMPTED", "preempted") and second["state"] == "SUCCEEDED"
    def place(a):  # Azure offers have no zone: they are placed (and cool down) per region
        return a["cloud"], a["region"], a["zone"] or a["zone_id"]

    assert place(first) != place(second)  # a place just seen reclaimed is tried last
    assert job["recoveries"] == 1

    events = api.get(f"/v1/jobs/{job_id}/events", headers=h).json()["events"]
    types = [e["type"] for e in events]
    notice = types.index("preemption_notice")
    committed = next(i for i, e in enumerate(events) if e["type"] == "checkpoint_committed"
                     and e["attempt_id"] == first["id"])
    resumed = next(e for e in events if e["type"] == "resumed" and e["attempt_id"] == second["id"])
    assert notice < committed
    moves = [(e["data"]["from"], e["data"]["to"]) for e in events if e["type"] == "job_state"]
    assert ("RUNNING", "PREEMPTING") in moves and ("PREEMPTING", "RECOVERING") in moves
    assert ("RECOVERING", "LAUNCHING") in moves

    checkpoints = api.get(f"/v1/jobs/{job_id}/checkpoints", headers=h).json()["checkpoints"]
    flushed = [c for c in checkpoints if c["attempt_id"] == first["id"]]
    assert flushed and resumed["data"]["step"] == flushed[0]["step"] > 0
    assert f"/{first['id']}/step-" in flushed[0]["uri"]  # under the first attempt's own prefix

    # The resumed run ends exactly where an uninterrupted one does.
    resumed_log = api.get(f"/v1/jobs/{job_id}/logs", headers=h).text
    assert final_loss(resumed_log) == uninterrupted_loss
    # The first attempt's output is still readable after its node is gone.
    assert "step=5 " in api.get(f"/v1/jobs/{job_id}/logs", params={"attempt": first["id"]}, headers=h).text

    keep = api.post(f"/v1/jobs/{job_id}/checkpoints/{flushed[0]['id']}/keep", headers=h)
    assert keep.status_code == 200 and keep.json()["keep"]


def test_simulate_preemption_is_refused_without_a_local_running_attempt(api, team_headers):
    h = team_headers()
    job_id = api.post("/v1/jobs", json={"run": "true"}, headers=h).json()["id"]
    wait_state(api, h, job_id, {"SUCCEEDED"})
    r = api.post(f"/v1/jobs/{job_id}/simulate-preemption", headers=h)
    assert r.status_code == 409 and r.headers["content-type"] == "application/problem+json"


# One database is enough here: the move's database side runs on both in
# tests/broker/test_reconciler.py; this is the agent and trainer side.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_run_short_of_slack_is_drained_and_resumes_on_demand(api, team_headers, settings, uninterrupted_loss):
    """The broker moves a job itself: the deadline comes closer than the work
    left, so the policy wants on-demand; the agent drains (flushes) the spot
    attempt, and the run resumes on-demand from that checkpoint."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update

    from spotbroker.broker.store.db import make_engine
    from spotbroker.broker.store.models import Job

    h = team_headers()
    # Slow enough that the run is still going when the drain comes (at 0.15 s a step it once ended
    # first on a loaded machine: the job then succeeds with its one attempt, tests/broker/recovery)
    run = " ".join(JOB_TRAIN + ["--step-seconds", "0.4"])
    far = (datetime.now(UTC) + timedelta(hours=20)).isoformat()
    job = api.post("/v1/jobs", json={"name": "train", "run": run, "estimated_hours": 1, "deadline": far,
                                     "resources": {"accelerators": "T4:1"}}, headers=h).json()
    job_id = job["id"]
    wait_state(api, h, job_id, {"RUNNING"}, timeout=60)
    wait_for(lambda: "step=5 " in api.get(f"/v1/jobs/{job_id}/logs", headers=h).text, timeout=60,
             what="training to be under way")
    engine = make_engine(settings.sqlalchemy_url)
    with engine.begin() as conn:  # its owner brings the deadline in: 50 min for 1 h of work
        spec = {**job["spec"], "deadline": (datetime.now(UTC) + timedelta(minutes=50)).isoformat()}
        conn.execute(update(Job).where(Job.id == job_id).values(spec=spec, next_check_at=datetime.now(UTC),
                                                                version=Job.version + 1))
    engine.dispose()

    job = wait_state(api, h, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    assert job["state"] == "SUCCEEDED", job
    first, second = job["attempts"]
    assert (first["state"], first["reason"], first["use_spot"]) == ("PREEMPTED", "moved", True)
    assert not second["use_spot"] and job["recoveries"] == 0
    events = api.get(f"/v1/jobs/{job_id}/events", headers=h).json()["events"]
    drain = next(e for e in events if e["type"] == "preemption_notice")
    assert drain["data"]["kind"] == "drain" and drain["attempt_id"] == first["id"]
    moving = next(e for e in events if e["type"] == "job_state" and e["data"]["to"] == "PREEMPTING")
    assert moving["data"]["reason"].startswith("moving: deadline")
    assert moving["data"]["towards"][0].endswith(" on-demand")
    resumed = next((e for e in events if e["type"] == "resumed" and e["attempt_id"] == second["id"]), None)
    assert resumed is not None and resumed["data"]["step"] > 0, timeline(api, h, job_id)  # once missing under load
    assert final_loss(api.get(f"/v1/jobs/{job_id}/logs", headers=h).text) == uninterrupted_loss
