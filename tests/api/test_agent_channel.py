"""The node agent's channel, spoken to as an agent speaks: over HTTP, with
the attempt's own token."""
from __future__ import annotations

from datetime import UTC, datetime

from helpers import wait_state

from spotbroker.broker.agent_channel import agent_token


def ev(seq: int, event_type: str, **data) -> dict:
    return {"seq": seq, "type": event_type, "at": datetime.now(UTC).isoformat(), "data": data}


def post(api, token: str, *events: dict):
    return api.post("/v1/agent/events", json={"events": list(events)}, headers={"Authorization": f"Bearer {token}"})


def running_job(api, h, settings) -> tuple[dict, str]:
    job_id = api.post("/v1/jobs", json={"run": "sleep 60"}, headers=h).json()["id"]
    job = wait_state(api, h, job_id, {"RUNNING"})
    return job, agent_token(settings.signing_key(), job["attempts"][-1]["id"])


def test_only_the_attempts_own_token_is_accepted(api, team_headers, settings):
    h = team_headers()
    job, token = running_job(api, h, settings)
    assert post(api, "sba_forged", ev(100, "heartbeat")).status_code == 401
    assert post(api, h["Authorization"].split()[1], ev(100, "heartbeat")).status_code == 401  # a team token
    assert api.post("/v1/agent/events", json={"events": []}).status_code == 401
    r = post(api, token, ev(100, "no_such_event"))
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_resent_events_are_stored_once_and_a_second_notice_changes_nothing(api, team_headers, settings):
    h = team_headers()
    job, token = running_job(api, h, settings)
    notice = ev(100, "preemption_notice", cloud="local", kind="preemption", deadline=None)
    first = post(api, token, notice).json()
    again = post(api, token, notice).json()
    assert (first["accepted"], again["accepted"], again["last_seq"]) == (1, 0, 100)
    assert api.get(f"/v1/jobs/{job['id']}", headers=h).json()["state"] == "PREEMPTING"
    r = post(api, token, ev(101, "no_flush", reason="no library"), ev(102, "preemption_notice", cloud="local"))
    assert r.json()["cancel"] is True  # the attempt is over: its agent should stop the trainer
    job = wait_state(api, h, job["id"], {"RUNNING", "LAUNCHING", "RECOVERING"})
    events = api.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["events"]
    assert [e["type"] for e in events].count("preemption_notice") == 2  # both kept
    moves = [(e["data"]["from"], e["data"]["to"]) for e in events if e["type"] == "job_state"]
    assert moves.count(("RUNNING", "PREEMPTING")) == 1 and moves.count(("PREEMPTING", "RECOVERING")) == 1
    first_attempt = api.get(f"/v1/jobs/{job['id']}", headers=h).json()["attempts"][0]
    assert (first_attempt["state"], first_attempt["reason"]) == ("PREEMPTED", "preempted")
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_a_notice_for_a_finished_job_moves_nothing_but_is_kept(api, team_headers, settings):
    h = team_headers()
    job_id = api.post("/v1/jobs", json={"run": "true"}, headers=h).json()["id"]
    job = wait_state(api, h, job_id, {"SUCCEEDED"})
    token = agent_token(settings.signing_key(), job["attempts"][0]["id"])
    r = post(api, token, ev(500, "preemption_notice", cloud="aws"),
             ev(501, "checkpoint_committed", step=3, uri="file:///x/step-000000000003", bytes=10,
                seconds=0.1, reason="flush"))
    assert r.status_code == 200 and r.json()["cancel"] is True
    assert api.get(f"/v1/jobs/{job_id}", headers=h).json()["state"] == "SUCCEEDED"
    # A late checkpoint is still a committed checkpoint under that attempt's own prefix.
    assert [c["step"] for c in api.get(f"/v1/jobs/{job_id}/checkpoints", headers=h).json()["checkpoints"]] == [3]


def test_logs_are_stored_by_offset(api, team_headers, settings):
    h = team_headers()
    job, token = running_job(api, h, settings)
    auth = {"Authorization": f"Bearer {token}"}
    attempt = job["attempts"][-1]["id"]

    def send(offset: int, data: bytes) -> int:
        r = api.post("/v1/agent/logs", content=data, headers={**auth, "X-Log-Offset": str(offset)})
        assert r.status_code == 200, r.text
        return r.json()["size"]

    base = send(0, b"")  # what the agent itself already shipped
    assert send(base, b"one\n") == base + 4
    assert send(base, b"one\n") == base + 4                  # re-sent: ignored
    assert send(base + 2, b"e\ntwo\n") == base + 8           # overlapping: only the new bytes
    assert send(base + 100, b"gap\n") == base + 8            # past the end: refused, resend from size
    text = api.get(f"/v1/jobs/{job['id']}/logs", params={"attempt": attempt}, headers=h).text
    assert text.endswith("one\ntwo\n")
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_a_node_whose_agent_goes_silent_is_recovered(api, team_headers, settings, job_scratch):
    h = team_headers()
    marker = job_scratch / "first"
    run = f"if [ -e {marker} ]; then echo second; else touch {marker}; sleep 60; fi"
    job_id = api.post("/v1/jobs", json={"run": run}, headers=h).json()["id"]
    job = wait_state(api, h, job_id, {"RUNNING"})
    token = agent_token(settings.signing_key(), job["attempts"][0]["id"])
    post(api, token, ev(1000, "heartbeat", pid=1, library=False))
    settings.heartbeat_timeout = 1.0  # shorter than the agent's 5 s beat: it now counts as silent
    job = wait_state(api, h, job_id, {"SUCCEEDED", "FAILED"}, timeout=30)
    settings.heartbeat_timeout = 60.0
    first, second = job["attempts"]
    assert (first["state"], first["reason"]) == ("PREEMPTED", "vanished") and second["state"] == "SUCCEEDED"
