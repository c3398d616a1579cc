"""The jobs API end to end: a real app, a real reconciler, the local launcher."""
import os
import threading
import time

import pytest
from sqlalchemy import func, select
from support.helpers import ev, post, running_job, wait_for, wait_state

from spotbroker.broker.store.db import make_engine
from spotbroker.broker.store.models import Event, Job

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def test_cpu_job_runs_to_success_with_events_logs_and_cost(api, team_headers):
    h = team_headers()
    r = api.post("/v1/jobs", json={"name": "hello", "run": "echo hello $GREETING", "envs": {"GREETING": "world"}},
                 headers=h)
    assert r.status_code == 201 and r.json()["state"] == "PENDING"
    job = wait_state(api, h, r.json()["id"], TERMINAL)
    assert job["state"] == "SUCCEEDED"
    (attempt,) = job["attempts"]
    # placed on a cloud's CPU machine (simulated here by the local launcher), priced as any place is
    assert attempt["cloud"] in ("aws", "gcp", "azure") and attempt["accelerator"] is None
    assert attempt["instance_type"] and attempt["price_per_hour"] > 0 and attempt["exit_code"] == 0
    for key in ("id", "state", "cloud", "region", "zone", "instance_type", "use_spot", "price_per_hour",
                "started_at", "ended_at"):
        assert key in attempt
    events = api.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["events"]
    assert events[0]["type"] == "submitted"
    moves = [(e["data"]["from"], e["data"]["to"]) for e in events if e["type"] == "job_state"]
    # A command that ends before the broker saw it up goes LAUNCHING -> SUCCEEDED directly.
    assert moves in ([("PENDING", "LAUNCHING"), ("LAUNCHING", "RUNNING"), ("RUNNING", "SUCCEEDED")],
                     [("PENDING", "LAUNCHING"), ("LAUNCHING", "SUCCEEDED")])
    assert all(set(e) >= {"type", "at", "attempt_id", "data"} for e in events)
    assert api.get(f"/v1/jobs/{job['id']}/logs", headers=h).text == "hello world\n"


def test_a_job_saying_infra_local_runs_on_the_brokers_host_at_no_price(api, team_headers):
    h = team_headers()
    r = api.post("/v1/jobs", json={"run": "echo here", "resources": {"infra": "local"}}, headers=h)
    job = wait_state(api, h, r.json()["id"], TERMINAL)
    (attempt,) = job["attempts"]
    assert job["state"] == "SUCCEEDED" and (attempt["cloud"], attempt["price_per_hour"]) == ("local", 0)
    assert r.json()["warnings"] == []
    # More nodes than this broker's local launcher runs at once: accepted (the setting may change), and
    # the answer says the job will wait for that (it said a plain PENDING, and `--wait` never returned).
    r = api.post("/v1/jobs", json={"run": "echo here", "num_nodes": 9, "resources": {"infra": "local"}}, headers=h)
    assert r.status_code == 201 and r.json()["warnings"] == [{
        "field": "num_nodes", "line": None, "message": "the job will be HELD: it needs 9 nodes, and the local "
        "launcher runs at most 8 at once (SPOTBROKER_LOCAL_MAX_RUNNING)"}], r.json()
    assert wait_state(api, h, r.json()["id"], {"HELD"})["reason"].startswith("it needs 9 nodes")
    api.post(f"/v1/jobs/{r.json()['id']}/cancel", headers=h)


def test_gpu_job_is_placed_on_the_cheapest_spot_offer_and_simulated_here(api, team_headers):
    h = team_headers()
    r = api.post("/v1/jobs", json={"run": 'echo "$SPOTBROKER_CLOUD $SPOTBROKER_INSTANCE_TYPE"; sleep 0.3',
                                   "resources": {"accelerators": "A100:8"}}, headers=h)
    job = wait_state(api, h, r.json()["id"], TERMINAL)
    a = job["attempts"][0]
    assert job["state"] == "SUCCEEDED" and a["use_spot"] and a["accelerator"] == "A100"
    assert a["price_per_hour"] > 0 and job["cost"] > 0
    assert api.get(f"/v1/jobs/{job['id']}/logs", headers=h).text.split() == [a["cloud"], a["instance_type"]]


def test_failing_command_fails_the_job_with_its_exit_code(api, team_headers):
    h = team_headers()
    job = wait_state(api, h, api.post("/v1/jobs", json={"run": "exit 3"}, headers=h).json()["id"], TERMINAL)
    assert job["state"] == "FAILED" and job["attempts"][0]["exit_code"] == 3 and "3" in job["reason"]


def test_restarts_recover_a_failing_run(api, team_headers, job_scratch):
    h = team_headers()
    marker = job_scratch / "ran-once"
    run = f'if [ -e {marker} ]; then echo second; else touch {marker}; exit 1; fi'
    job = wait_state(api, h, api.post("/v1/jobs", json={"run": run, "max_restarts": 2}, headers=h).json()["id"],
                     TERMINAL)
    assert job["state"] == "SUCCEEDED" and job["restarts"] == 1
    assert [a["state"] for a in job["attempts"]] == ["FAILED", "SUCCEEDED"]


def test_a_cancel_that_races_another_writer_is_not_a_500(api, team_headers):
    """The reconciler or an agent's report may change the attempt between the
    cancel's read and its write (its version moves on): the cancel is taken
    again on the new row, as the agent channel does, never a 500."""
    from sqlalchemy import event, update
    from sqlalchemy.orm import Session

    from spotbroker.broker.store.models import Attempt

    h = team_headers()
    job_id = api.post("/v1/jobs", json={"run": "sleep 60"}, headers=h).json()["id"]
    wait_state(api, h, job_id, {"RUNNING"})

    raced: list[int] = []

    def another_writer(session, flush_context, instances) -> None:
        cancelled = [a for a in session.dirty if isinstance(a, Attempt) and a.state == "CANCELLED"]
        if cancelled and not raced:  # once: the retry must then go through
            raced.append(cancelled[0].id)
            session.execute(update(Attempt).where(Attempt.id == cancelled[0].id)
                            .values(version=Attempt.version + 1).execution_options(synchronize_session=False))
    event.listen(Session, "before_flush", another_writer)
    try:
        r = api.post(f"/v1/jobs/{job_id}/cancel", headers=h)
    finally:
        event.remove(Session, "before_flush", another_writer)
    assert raced and r.status_code == 200, r.text
    assert r.json()["state"] == "CANCELLED" and r.json()["attempts"][0]["state"] == "CANCELLED"


def test_cancel_stops_the_process(api, team_headers, settings):
    h = team_headers()
    job_id = api.post("/v1/jobs", json={"run": "echo started; sleep 60"}, headers=h).json()["id"]
    wait_state(api, h, job_id, {"RUNNING"})
    wait_for(lambda: "started" in api.get(f"/v1/jobs/{job_id}/logs", headers=h).text, what="output")
    r = api.post(f"/v1/jobs/{job_id}/cancel", headers=h)
    assert r.status_code == 200 and r.json()["state"] == "CANCELLED"
    assert r.json()["attempts"][0]["state"] == "CANCELLED"
    import json
    node = json.loads((settings.data_dir / "runs" / str(r.json()["attempts"][0]["id"]) / "node-0.json").read_text())

    def gone():
        try:
            os.kill(node["pid"], 0)
            return open(f"/proc/{node['pid']}/stat").read().split(") ")[1].startswith("Z")
        except (ProcessLookupError, FileNotFoundError):  # reaped, maybe between the two looks
            return True

    wait_for(gone, what="the cancelled process to exit")
    assert api.post(f"/v1/jobs/{job_id}/cancel", headers=h).json()["state"] == "CANCELLED"  # idempotent


def test_follow_streams_the_job_until_it_ends_and_an_attempt_until_it_ends(api, team_headers):
    h = team_headers()
    job_id = api.post("/v1/jobs", json={"run": "for i in 1 2 3; do echo line $i; sleep 0.2; done"},
                      headers=h).json()["id"]
    wait_for(lambda: api.get(f"/v1/jobs/{job_id}", headers=h).json()["attempts"], what="an attempt")
    with api.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true"}, headers=h) as r:
        text = "".join(r.iter_text())
    job = api.get(f"/v1/jobs/{job_id}", headers=h).json()
    attempt = job["attempts"][0]
    where = f"{attempt['cloud']} {attempt['zone'] or attempt['region']}"
    assert text == (f"\u2014 attempt {attempt['id']} on {where} \u2014\nline 1\nline 2\nline 3\n"
                    f"\u2014 job {job_id} SUCCEEDED \u2014\n")
    with api.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true", "tail": 1}, headers=h) as r:
        assert "".join(r.iter_text()) == (f"\u2014 attempt {attempt['id']} on {where} \u2014\nline 3\n"
                                          f"\u2014 job {job_id} SUCCEEDED \u2014\n")
    # One attempt's output alone, as before: `attempt` names it.
    with api.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true", "attempt": attempt["id"]},
                    headers=h) as r:
        assert "".join(r.iter_text()) == "line 1\nline 2\nline 3\n"
    assert api.get(f"/v1/jobs/{job_id}/logs", params={"tail": 1}, headers=h).text == "line 3\n"
    # Output that ends without a newline (a progress bar's last state): the story line starts its own
    # line, where it was glued to the output ("unterminated\u2014 job 21 SUCCEEDED \u2014").
    open_id = api.post("/v1/jobs", json={"run": "printf 'first line\\nunterminated'"}, headers=h).json()["id"]
    wait_for(lambda: api.get(f"/v1/jobs/{open_id}", headers=h).json()["attempts"], what="an attempt")
    with api.stream("GET", f"/v1/jobs/{open_id}/logs", params={"follow": "true"}, headers=h) as r:
        text = "".join(r.iter_text())
    assert text.endswith(f"\u2014\nfirst line\nunterminated\n\u2014 job {open_id} SUCCEEDED \u2014\n"), text
    with api.stream("GET", f"/v1/jobs/{open_id}/logs", params={"follow": "false"}, headers=h) as r:
        assert "".join(r.iter_text()) == "first line\nunterminated"  # (the log itself as it was written)


def test_following_a_job_shows_what_a_preempted_node_prints_after_its_attempt_ended(api, team_headers, settings):
    """A preemption ends the attempt at the flush, and the next one starts at
    once; the old node prints on until the cloud takes it. The follower says
    the change only after that node's last word (its agent reports the
    trainer's exit once the log is shipped), so nothing it printed is lost."""
    h = team_headers()
    job, token = running_job(api, h, settings)
    job_id = job["id"]
    node = {"Authorization": f"Bearer {token}"}

    def ship(data: bytes) -> None:
        at = api.post("/v1/agent/logs", content=b"", headers={**node, "X-Log-Offset": "0"}).json()["size"]
        assert api.post("/v1/agent/logs", content=data, headers={**node, "X-Log-Offset": str(at)}).status_code == 200

    seen: list[str] = []

    def follow() -> None:
        with api.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true"}, headers=h) as r:
            seen.extend(r.iter_text())

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    ship(b"step=1\n")
    wait_for(lambda: "step=1" in "".join(seen), what="the follower to show the first line")
    # (seqs past the real agent's own, so that its exit report, when the release stops it, is a re-send)
    assert post(api, token, ev(100, "preemption_notice", cloud="local"), ev(101, "no_flush", reason="test")).is_success
    wait_for(lambda: len(api.get(f"/v1/jobs/{job_id}", headers=h).json()["attempts"]) == 2, what="the next attempt")
    time.sleep(2.5)  # the follower has looked at the job since (it checks every second)
    ship(b"step=2 printed until the cloud took the node\n")
    assert post(api, token, ev(102, "trainer_exited", exit_code=143)).is_success
    second = api.get(f"/v1/jobs/{job_id}", headers=h).json()["attempts"][1]["id"]
    wait_for(lambda: f"(attempt {second})" in "".join(seen), what="the follower to say where the job resumed")
    api.post(f"/v1/jobs/{job_id}/cancel", headers=h)
    follower.join(30)
    text = "".join(seen)
    assert not follower.is_alive() and text.splitlines()[-1].startswith(f"\u2014 job {job_id} CANCELLED"), text
    assert text.index("step=1") < text.index("step=2 printed") < text.index(f"(attempt {second})"), text


def test_list_filters_and_paginates(api, team_headers):
    h = team_headers()
    ids = [api.post("/v1/jobs", json={"name": f"j{i}", "run": "true"}, headers=h).json()["id"] for i in range(5)]
    for i in ids:
        wait_state(api, h, i, TERMINAL)
    seen, cursor = [], None
    while True:
        page = api.get("/v1/jobs", params={"limit": 2, **({"cursor": cursor} if cursor else {})}, headers=h).json()
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids, reverse=True)
    assert len(api.get("/v1/jobs", params={"state": "SUCCEEDED"}, headers=h).json()["jobs"]) == 5
    assert api.get("/v1/jobs", params={"state": "RUNNING"}, headers=h).json()["jobs"] == []
    assert api.get("/v1/jobs", params={"state": "BOGUS"}, headers=h).status_code == 422


def test_teams_see_only_their_own_jobs(api, team_headers):
    alice, bob = team_headers("alice"), team_headers("bob")
    job_id = api.post("/v1/jobs", json={"run": "true"}, headers=alice).json()["id"]
    for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/events", f"/v1/jobs/{job_id}/logs"):
        assert api.get(path, headers=bob).status_code == 404
    assert api.post(f"/v1/jobs/{job_id}/cancel", headers=bob).status_code == 404
    assert api.get("/v1/jobs", headers=bob).json()["jobs"] == []
    assert api.get(f"/v1/jobs/{job_id}", headers=alice).status_code == 200


def test_every_call_needs_a_valid_token(api, team_headers):
    team_headers()
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic abc"}):
        r = api.get("/v1/jobs", headers=headers)
        assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json"
    admin = {"Authorization": "Bearer admin-token-for-tests"}
    assert api.get("/v1/jobs", headers=admin).status_code == 403        # the admin has no team
    assert api.post("/v1/teams", json={"name": "x"}, headers=team_headers("t2")).status_code == 403
    assert api.post("/v1/teams", json={"name": "t2"}, headers=admin).status_code == 409
    token = api.post("/v1/teams/t2/tokens", headers=admin).json()["token"]
    assert api.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"}).json()["name"] == "t2"
    assert api.get("/healthz").status_code == 200 and api.get("/readyz").json()["status"] == "ok"


MALFORMED = [
    (b"", "application/json"), (b"{", "application/json"), (b"[]", "application/json"),
    (b"null", "application/json"), (b'"run"', "application/json"), (b"\xff\xfe\x00", "application/json"),
    (b'{"run": "\xff"}', "application/json"), (b'{"run": 1}', "application/json"),
    (b'{"run": "x", "bogus": 1}', "application/json"), (b'{"run": "x", "num_nodes": -2}', "application/json"),
    (b'{"run": "x", "num_nodes": 1e400}', "application/json"),
    (b'{"run": "x", "resources": {"accelerators": "A100:x"}}', "application/json"),
    (b'{"run": "x", "resources": {"accelerators": ":"}}', "application/json"),
    (b'{"run": "x", "resources": {"accelerators": 5}}', "application/json"),
    (b'{"run": "x", "resources": {"any_of": []}}', "application/json"),
    (b'{"run": "x", "resources": {"any_of": [], "ordered": []}}', "application/json"),
    (b'{"run": "x", "resources": {"infra": "aws/"}}', "application/json"),
    (b'{"run": "x", "resources": {"cpus": -1}}', "application/json"),
    (b'{"run": "x", "envs": {"A": {"b": 1}}}', "application/json"),
    (b'{"run": "x", "envs": []}', "application/json"),
    (b'{"run": "x", "deadline": "tomorrow"}', "application/json"),
    (b'{"run": "x", "max_restarts": "many"}', "application/json"),
    (b'{"run": "x", "name": "has spaces"}', "application/json"),
    (b"run: [\n", "application/yaml"), (b"- a\n- b\n", "application/yaml"),
    (b"run: x\nresources: {accelerators: {A100: 1, H100: x}}\n", "application/yaml"),
    (b"!!python/object:os.system x", "application/yaml"),
    (b"<xml/>", "text/xml"),
    (b'{"run": "x"}' + b" " * (1 << 20), "application/json"),
]


@pytest.mark.parametrize("body, ctype", MALFORMED)
def test_malformed_bodies_get_a_clear_4xx_and_write_nothing(api, team_headers, settings, body, ctype):
    h = {**team_headers(), "Content-Type": ctype}
    r = api.post("/v1/jobs", content=body, headers=h)
    assert 400 <= r.status_code < 500, r.text
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert problem["status"] == r.status_code and problem["detail"]
    if r.status_code == 422:
        assert problem["errors"] and all(e["field"] for e in problem["errors"])
    engine = make_engine(settings.sqlalchemy_url)
    with engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(Job)) == 0
        assert conn.scalar(select(func.count()).select_from(Event)) == 0
    engine.dispose()


def test_a_jobs_events_come_a_bounded_page_at_a_time(api, team_headers, settings):
    """A job's agent may write events at 10 a second for days: one answer
    holds at most a page (1,000), and `next_after` leads to the next."""
    from datetime import UTC, datetime

    from spotbroker.broker.cli.client import Client
    from spotbroker.broker.store.db import make_session_factory, transaction

    h = team_headers()
    job_id = api.post("/v1/jobs", json={"run": "true"}, headers=h).json()["id"]
    wait_state(api, h, job_id, TERMINAL)
    engine = make_engine(settings.sqlalchemy_url)
    with transaction(make_session_factory(engine)) as s:
        s.add_all(Event(job_id=job_id, type="resumed", at=datetime.now(UTC), data={"n": i}) for i in range(1_200))
    engine.dispose()
    everything = api.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}, headers=h).json()
    first = api.get(f"/v1/jobs/{job_id}/events", headers=h).json()
    assert first == everything and len(first["events"]) == 1000
    rest = api.get(f"/v1/jobs/{job_id}/events", params={"after": first["next_after"]}, headers=h).json()
    assert rest["next_after"] is None and first["next_after"] == first["events"][-1]["id"]
    ids = [e["id"] for e in first["events"] + rest["events"]]
    assert ids == sorted(set(ids)) and len(ids) > 1_200  # the job's own events and the 1,200
    two = api.get(f"/v1/jobs/{job_id}/events", params={"limit": 2}, headers=h).json()
    assert [e["id"] for e in two["events"]] == ids[:2] and two["next_after"] == ids[1]
    r = api.get(f"/v1/jobs/{job_id}/events", params={"limit": 1001}, headers=h)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "limit"
    client = Client(str(api.base_url), h["Authorization"].split()[1])
    assert [e["id"] for e in client.events(job_id)] == ids  # the CLI reads every page


def test_wrong_field_is_named(api, team_headers):
    r = api.post("/v1/jobs", json={"run": "x", "resources": {"accelerators": "A100:x"}}, headers=team_headers())
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "resources.accelerators"
    r = api.post("/v1/jobs", content=b"name: x\nrun: echo\nresources:\n  cpus: [\n",
                 headers={**team_headers("t3"), "Content-Type": "application/yaml"})
    assert r.status_code == 422 and r.json()["errors"][0]["line"] == 5


def test_a_deadline_needs_an_estimate_and_room_for_the_work(api, team_headers):
    from datetime import UTC, datetime, timedelta

    h = team_headers()
    soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    r = api.post("/v1/jobs", json={"run": "x", "deadline": soon}, headers=h)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "deadline"
    assert "estimated_hours" in r.json()["errors"][0]["message"]
    r = api.post("/v1/jobs", json={"run": "x", "deadline": soon, "estimated_hours": 1}, headers=h)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "deadline"
    assert "sooner than the work" in r.json()["errors"][0]["message"]
    later = (datetime.now(UTC) + timedelta(hours=3)).isoformat()
    r = api.post("/v1/jobs", json={"run": "x", "deadline": later, "estimated_hours": 1}, headers=h)
    assert r.status_code == 201 and r.json()["spec"]["estimated_hours"] == 1


def test_yaml_submission(api, team_headers):
    h = {**team_headers(), "Content-Type": "application/yaml"}
    r = api.post("/v1/jobs", content=b"name: from-yaml\nrun: echo yaml\nresources:\n  accelerators: {T4: 1}\n",
                 headers=h)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["resources"]["accelerators"] == "T4:1"


def test_openapi_is_complete(api):
    schema = api.get("/openapi.json").json()
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/events", "/v1/jobs/{job_id}/logs",
            "/v1/jobs/{job_id}/cancel", "/healthz", "/readyz"} <= set(schema["paths"])
    body = schema["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"]["$ref"] == "#/components/schemas/JobSpec"
    assert "JobSpec" in schema["components"]["schemas"] and "Resources" in schema["components"]["schemas"]
    # Every route that reads the database may answer 503 (the README tells clients so): each declares it.
    silent = [f"{m} {p}" for p, ops in schema["paths"].items() for m, op in ops.items()
              if "401" in op["responses"] and "503" not in op["responses"]]
    assert not silent, silent




def test_idempotency_key_makes_a_retry_return_the_same_job(api, team_headers):
    alice, bob = team_headers("alice"), team_headers("bob")
    first = api.post("/v1/jobs", json={"run": "true"}, headers={**alice, "Idempotency-Key": "k1"})
    again = api.post("/v1/jobs", json={"run": "true"}, headers={**alice, "Idempotency-Key": "k1"})
    other = api.post("/v1/jobs", json={"run": "true"}, headers={**bob, "Idempotency-Key": "k1"})
    assert first.status_code == again.status_code == 201
    assert first.json()["id"] == again.json()["id"] != other.json()["id"]
    assert len(api.get("/v1/jobs", headers=alice).json()["jobs"]) == 1


def test_an_idempotency_key_reused_for_another_job_is_refused(api, team_headers):
    """A key names one request: sent again with another body, it must not
    silently answer with the first job (the caller would think the second
    one was submitted)."""
    h = team_headers()
    first = api.post("/v1/jobs", json={"name": "a", "run": "true"}, headers={**h, "Idempotency-Key": "k2"})
    other = api.post("/v1/jobs", json={"name": "b", "run": "true"}, headers={**h, "Idempotency-Key": "k2"})
    assert first.status_code == 201
    assert other.status_code == 422, other.text
    assert other.json()["errors"][0]["field"] == "Idempotency-Key"
    assert [j["name"] for j in api.get("/v1/jobs", headers=h).json()["jobs"]] == ["a"]


def test_a_retry_is_answered_by_what_it_sends_not_by_todays_rules(api, team_headers):
    """The retry of a request that had made its job was judged again against the
    policy (and the clock) of the retry: the admin's narrower accelerators made it a
    422 that named the spec and not the job, and new policy defaults "another request"."""
    from conftest import ADMIN_TOKEN

    h = team_headers("ml")
    body = {"name": "a", "run": "sleep 600", "resources": {"accelerators": "T4:1"}}
    first = api.post("/v1/jobs", json=body, headers={**h, "Idempotency-Key": "k3"})
    assert first.status_code == 201, first.text
    policy = {"allowed_accelerators": ["L4"], "envs": {"HF_HOME": "/cache"}}
    assert api.put("/v1/teams/ml/policy", json=policy,
                   headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 200
    again = api.post("/v1/jobs", json=body, headers={**h, "Idempotency-Key": "k3"})
    assert again.status_code == 201 and again.json()["id"] == first.json()["id"], again.text
    other = api.post("/v1/jobs", json={**body, "name": "b"}, headers={**h, "Idempotency-Key": "k3"})
    assert other.status_code == 422 and other.json()["errors"][0]["field"] == "Idempotency-Key", other.text
    assert f"already used for job {first.json()['id']}" in other.json()["errors"][0]["message"]
    fresh = api.post("/v1/jobs", json=body, headers={**h, "Idempotency-Key": "k4"})  # a new job meets the policy
    assert fresh.status_code == 422 and fresh.json()["errors"][0]["field"] == "resources.accelerators", fresh.text
    api.post(f"/v1/jobs/{first.json()['id']}/cancel", headers=h)


def test_concurrent_submissions_are_written_together_each_with_its_own_job(api, team_headers, settings):
    """Group commit: many submissions at once, some retried under one key."""
    import asyncio

    import httpx

    h = team_headers()

    async def burst() -> list[dict]:
        async with httpx.AsyncClient(base_url=str(api.base_url), headers=h, timeout=30) as c:
            async def one(i: int) -> dict:
                key = {"Idempotency-Key": f"k{i % 20}"} if i % 2 else {}
                name = f"k{i % 20}" if i % 2 else f"b{i}"  # a retry sends the same body
                r = await c.post("/v1/jobs", json={"name": name, "run": "true"}, headers=key)
                assert r.status_code == 201, r.text
                return r.json()

            return await asyncio.gather(*[one(i) for i in range(80)])

    answers = asyncio.run(burst())
    plain = [a["id"] for i, a in enumerate(answers) if i % 2 == 0]
    keyed = {f"k{i % 20}": a["id"] for i, a in enumerate(answers) if i % 2}
    assert len(set(plain)) == 40                                   # every plain submission its own job
    for i, a in enumerate(answers):
        if i % 2:
            assert a["id"] == keyed[f"k{i % 20}"]                  # a retried key: the same job
    assert len(set(plain) | set(keyed.values())) == 50
    assert len(api.get("/v1/jobs", params={"limit": 500}, headers=h).json()["jobs"]) == 50


def test_a_followed_log_ends_when_the_token_that_opened_it_is_rotated(api, team_headers, monkeypatch):
    """A follow opened with a leaked token went on for the rest of the job after the
    team rotated it (new requests got 401 at once): it ends, saying why."""
    from conftest import ADMIN_TOKEN

    from spotbroker.api import following

    monkeypatch.setattr(following, "RECHECK_S", 0.5)
    h = team_headers("ml")
    job_id = api.post("/v1/jobs", json={"run": "while true; do echo tick; sleep 0.2; done"}, headers=h).json()["id"]
    wait_state(api, h, job_id, {"RUNNING"}, timeout=60)
    got, rotated = b"", None
    with api.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true"}, headers=h, timeout=60) as r:
        started = time.monotonic()
        for chunk in r.iter_bytes():
            got += chunk
            if b"tick" in got and rotated is None:
                rotated = api.post("/v1/teams/ml/tokens/rotate", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
                assert rotated.status_code in (200, 201), rotated.text
                h = {"Authorization": f"Bearer {rotated.json()['token']}"}
            assert time.monotonic() - started < 30, "the stream went on after the rotation"
    assert got.rstrip().endswith(f"— {following.REVOKED_LINE} —".encode()), got[-300:]
    api.post(f"/v1/jobs/{job_id}/cancel", headers=h)
