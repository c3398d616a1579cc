"""The job spec's `checkpoint.interval` through the API: refused with a 422
naming the field, taken out of a SkyPilot task file, and the interval in
force (and why) shown on the job once its agent speaks."""
from __future__ import annotations

import pytest
from helpers import wait_for, wait_state

YAML = "application/yaml"


@pytest.mark.parametrize("checkpoint, word", [
    ({"interval": "often"}, "auto"),
    ({"interval": 0}, "seconds"),
    ({"interval": True}, "auto"),
    ({"interval": None}, "auto"),
    ({"interval": 10 ** 9}, "seconds"),
    ({"every": 60}, "extra"),
])
def test_a_bad_interval_is_a_422_naming_the_field(api, team_headers, checkpoint, word):
    r = api.post("/v1/jobs", json={"run": "true", "checkpoint": checkpoint}, headers=team_headers())
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json", r.text
    error = r.json()["errors"][0]
    assert error["field"].startswith("checkpoint"), error
    assert word in error["message"].lower(), error


def test_a_task_files_checkpoint_key_is_ours_and_checked_with_its_line(api, team_headers):
    h = {**team_headers(), "Content-Type": YAML}
    bad = b"run: python train.py\nresources:\n  accelerators: T4:1\ncheckpoint:\n  interval: fast\n"
    r = api.post("/v1/jobs", content=bad, headers=h)
    assert r.status_code == 422, r.text
    error = r.json()["errors"][0]
    assert error["field"] == "checkpoint.interval" and error.get("line") == 5, error
    good = b"run: sleep 1\nresources:\n  accelerators: T4:1\ncheckpoint:\n  interval: 900\n"
    r = api.post("/v1/jobs", content=good, headers=h)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["checkpoint"] == {"interval": 900.0}
    api.post(f"/v1/jobs/{r.json()['id']}/cancel", headers=h)


def interval_of(api, h, job_id: int) -> dict:
    return wait_for(lambda: api.get(f"/v1/jobs/{job_id}", headers=h).json()["checkpoint_interval"], timeout=60,
                    what="the job's checkpoint interval")


def test_the_job_shows_the_interval_in_force_and_why(api, team_headers):
    h = team_headers()
    jobs = {mode: api.post("/v1/jobs", json={"run": "sleep 60", "resources": {"accelerators": "T4:1"},
                                             **({"checkpoint": {"interval": mode}} if mode else {})},
                           headers=h).json()["id"] for mode in (None, "code", 900)}
    auto = interval_of(api, h, jobs[None])
    assert auto["mode"] == "auto" and not auto["cost_measured"] and auto["reclaims"] == 0
    assert 60 <= auto["seconds"] <= 7200 and "MTBF" in auto["why"]
    assert auto["zone"].split("/")[0] in ("aws", "gcp", "azure")
    assert interval_of(api, h, jobs["code"])["seconds"] is None
    fixed = interval_of(api, h, jobs[900])
    assert (fixed["mode"], fixed["seconds"]) == ("fixed", 900.0)
    events = api.get(f"/v1/jobs/{jobs[None]}/events", headers=h).json()["events"]
    told = [e["data"] for e in events if e["type"] == "checkpoint_interval"]
    assert told and told[0]["seconds"] == auto["seconds"]
    for job_id in jobs.values():
        api.post(f"/v1/jobs/{job_id}/cancel", headers=h)
        wait_state(api, h, job_id, {"CANCELLED"})
