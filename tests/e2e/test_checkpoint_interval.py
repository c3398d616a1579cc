"""The fitted checkpoint interval end to end on the local launcher: reclaims
in a zone shorten the interval the broker tells the library there, and a job
that a preemption moves to another zone trains at that zone's interval."""
from __future__ import annotations

from pathlib import Path

import pytest
from support.helpers import timeline, wait_for, wait_state

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
# Checkpoints every 1000 steps or 10 min by the trainer's own word: the broker's interval replaces both.
RUN = " ".join(["python", str(REPO / "examples" / "train.py"), "--steps", "100000", "--every-steps", "1000",
                "--step-seconds", "0.1", "--log-every", "1"])
REGION = "aws/af-south-1"  # g4dn.xlarge (T4) spot in two zones: afs1-az3, then afs1-az2 by price
STORMY = "afs1-az2"


def submit(api, h, infra: str) -> int:
    return api.post("/v1/jobs", json={"name": "train", "run": RUN, "max_restarts": 0,
                                      "resources": {"accelerators": "T4:1", "instance_type": "g4dn.xlarge",
                                                    "infra": infra}}, headers=h).json()["id"]


def running_attempt(api, h, job_id: int, n: int) -> dict:
    """The job's `n`th attempt once it runs and its library has taken the broker's interval."""
    def ready():
        job = api.get(f"/v1/jobs/{job_id}", headers=h).json()
        if len(job["attempts"]) < n or job["state"] != "RUNNING" or not job["attempts"][n - 1]["checkpoint_interval"]:
            return None
        attempt = job["attempts"][n - 1]
        return attempt if adopted(api, h, job_id, attempt["id"]) else None

    try:
        return wait_for(ready, timeout=120, what=f"attempt {n} to run at the broker's interval")
    except AssertionError:
        print(timeline(api, h, job_id), api.get(f"/v1/jobs/{job_id}", headers=h).json())
        raise


def adopted(api, h, job_id: int, attempt_id: int) -> list[float]:
    events = api.get(f"/v1/jobs/{job_id}/events", headers=h).json()["events"]
    return [e["data"]["seconds"] for e in events
            if e["type"] == "checkpoint_interval_adopted" and e["attempt_id"] == attempt_id]


def preempt(api, h, job_id: int) -> None:
    r = api.post(f"/v1/jobs/{job_id}/simulate-preemption", headers=h)
    assert r.status_code == 202, r.text


def test_reclaims_shorten_the_interval_and_a_moved_job_takes_its_new_zones(api, team_headers):
    h = team_headers()
    # 1. A job held to one zone: each reclaim there shortens the interval its next attempt is told.
    pinned = submit(api, h, f"{REGION}/{STORMY}")
    first = running_attempt(api, h, pinned, 1)
    assert first["zone_id"] == STORMY and first["checkpoint_interval"]["reclaims"] == 0
    assert adopted(api, h, pinned, first["id"]) == [first["checkpoint_interval"]["seconds"]]
    preempt(api, h, pinned)
    second = running_attempt(api, h, pinned, 2)
    assert second["zone_id"] == STORMY and second["checkpoint_interval"]["reclaims"] == 1
    assert second["checkpoint_interval"]["zone_mtbf_s"] < first["checkpoint_interval"]["zone_mtbf_s"]
    assert second["checkpoint_interval"]["seconds"] < first["checkpoint_interval"]["seconds"]
    assert adopted(api, h, pinned, second["id"]) == [second["checkpoint_interval"]["seconds"]]
    api.post(f"/v1/jobs/{pinned}/cancel", headers=h)
    wait_state(api, h, pinned, {"CANCELLED"})

    # 2. A job free in the region starts in the calm zone; a preemption moves it to the stormy
    # one, where the library takes the shorter interval the broker tells it there.
    free = submit(api, h, REGION)
    calm = running_attempt(api, h, free, 1)
    assert calm["zone_id"] != STORMY and calm["checkpoint_interval"]["reclaims"] == 0
    preempt(api, h, free)
    moved = running_attempt(api, h, free, 2)
    assert moved["zone_id"] == STORMY and moved["checkpoint_interval"]["reclaims"] >= 1
    assert moved["checkpoint_interval"]["seconds"] < calm["checkpoint_interval"]["seconds"]
    assert adopted(api, h, free, moved["id"]) == [moved["checkpoint_interval"]["seconds"]]
    job = api.get(f"/v1/jobs/{free}", headers=h).json()
    assert job["checkpoint_interval"] == moved["checkpoint_interval"]  # the job shows the one in force
    api.post(f"/v1/jobs/{free}/cancel", headers=h)
    wait_state(api, h, free, {"CANCELLED"})
