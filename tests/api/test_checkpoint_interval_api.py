"""The job spec's `checkpoint.interval` through the API: refused with a 422
naming the field, taken out of a SkyPilot task file, and the interval in
force (and why) shown on the job once its agent speaks."""
from __future__ import annotations

import pytest
from support.helpers import wait_for, wait_state

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


def test_a_running_jobs_interval_shrinks_when_its_zone_is_seen_reclaimed(api, team_headers, settings, factory):
    """The estimate changes while the job runs (other jobs' instances reclaimed
    in its zone): the agent's next report brings the shorter interval."""
    from datetime import UTC, datetime, timedelta

    from support.world import World

    h = team_headers()
    job_id = api.post("/v1/jobs", json={"run": "sleep 120", "resources": {"accelerators": "T4:1"}},
                      headers=h).json()["id"]
    before = interval_of(api, h, job_id)
    here = api.get(f"/v1/jobs/{job_id}", headers=h).json()["attempts"][-1]
    world = World(factory)
    other = world.job(world.team("others"), state="SUCCEEDED")
    now = datetime.now(UTC)
    for i in range(6):  # six instances of another team's, each reclaimed after 10 minutes
        start = now - timedelta(hours=6 - i)
        world.attempt(other, start=start, end=start + timedelta(minutes=10), end_reason="preempted",
                      cloud=here["cloud"], region=here["region"], zone_id=here["zone_id"],
                      instance_type=here["instance_type"], accelerator="T4")
    settings.placement_interval = 1.0  # fitted again at the agent's next report, not a minute later
    try:
        after = wait_for(lambda: (i := api.get(f"/v1/jobs/{job_id}", headers=h).json()["checkpoint_interval"])
                         and i["reclaims"] == 6 and i, timeout=60, what="the interval fitted again")
    finally:
        settings.placement_interval = 60.0
    assert after["seconds"] < before["seconds"] and after["zone_mtbf_s"] < before["zone_mtbf_s"]
    events = api.get(f"/v1/jobs/{job_id}/events", headers=h).json()["events"]
    told = [e["data"] for e in events if e["type"] == "checkpoint_interval"]
    assert [t["seconds"] for t in told] == [before["seconds"], after["seconds"]]
    assert told[-1]["previous_seconds"] == before["seconds"]
    api.post(f"/v1/jobs/{job_id}/cancel", headers=h)


def test_a_measured_checkpoint_cost_refits_the_interval_in_the_agents_answer(api, team_headers, settings):
    """A periodic commit's `seconds` (stall + persist) is C: the answer to that
    very report carries the interval fitted with it."""
    from support.helpers import ev, post

    from spotbroker.broker.recovery import interval as fit
    from spotbroker.broker.recovery.agent_channel import agent_token

    h = team_headers()
    job_id = api.post("/v1/jobs", json={"run": "sleep 120", "resources": {"accelerators": "T4:1"}},
                      headers=h).json()["id"]
    before = interval_of(api, h, job_id)
    attempt_id = api.get(f"/v1/jobs/{job_id}", headers=h).json()["attempts"][-1]["id"]
    prefix = f"{settings.checkpoint_uri}/ml/{job_id}/{attempt_id}"
    commits = [ev(5_000 + i, "checkpoint_committed", step=10 * i, uri=f"{prefix}/step-{10 * i:012d}", bytes=10,
                  seconds=seconds, reason="periodic") for i, seconds in enumerate((3.0, 4.0, 9.0), start=1)]
    answer = post(api, agent_token(settings.signing_key(), attempt_id), *commits)
    assert answer.status_code == 200, answer.text
    after = api.get(f"/v1/jobs/{job_id}", headers=h).json()["checkpoint_interval"]
    assert after["cost_measured"] and after["cost_s"] == 4.0  # the median of the three
    assert after["seconds"] == pytest.approx(fit.young_daly(4.0, after["zone_mtbf_s"]), abs=0.2)
    assert after["seconds"] < before["seconds"]
    assert answer.json()["checkpoint_interval_s"] == after["seconds"]
    api.post(f"/v1/jobs/{job_id}/cancel", headers=h)
