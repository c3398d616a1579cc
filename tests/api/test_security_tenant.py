"""What a hostile tenant tried against a running broker (docs/security.md,
"Probing as a hostile tenant"), for the holes it found.

A job's `envs` and `secrets` may not name the variables the broker sets for
each attempt. On a SkyPilot node a secret wins over the node program's
`envs` (SkyPilot's `envs_and_secrets`), so a secret named `RESUME_FROM` or
`CHECKPOINT_URI` would make a job load, or write, another team's checkpoint
with the node's storage credentials; `SPOTBROKER_CODE_URI`, another team's
code. Refused at submission, naming the variable."""
from __future__ import annotations

import pytest

from spotbroker.agent import protocol

NAMES = ["CHECKPOINT_URI", "RESUME_FROM", "SPOTBROKER_CHECKPOINT_JOB_URI", "SPOTBROKER_AGENT_TOKEN", "SPOTBROKER_URL",
         "SPOTBROKER_JOB_ID", "SPOTBROKER_ATTEMPT_ID", "SPOTBROKER_CODE_URI", "SPOTBROKER_CODE_SHA256",
         "SPOTBROKER_CONTROL_DIR", "SPOTBROKER_METADATA_URL", "SPOTBROKER_CLOUD"]


@pytest.mark.parametrize("name", NAMES)
def test_a_job_cannot_set_what_the_broker_sets_for_each_attempt(api, team_headers, name):
    h = team_headers("b")
    other = "file:///var/lib/spotbroker/checkpoints/a/1/1/step-000000000100"
    for kind in ("envs", "secrets"):
        r = api.post("/v1/jobs", json={"run": "true", kind: {"A": "1", name: other}}, headers=h)
        assert r.status_code == 422, (kind, name, r.text)
        (error,) = r.json()["errors"]
        assert error["field"] == kind and name in error["message"] and "for each attempt" in error["message"]
        assert other not in r.text  # a secret's value is never echoed
    r = api.post("/v1/jobs", content=f"run: 'true'\nsecrets: {{{name}: x}}\n",
                 headers={**h, "Content-Type": "application/yaml"})
    assert r.status_code == 422 and name in r.text, r.text
    assert api.get("/v1/jobs", headers=h).json()["jobs"] == []


def test_the_names_are_the_ones_the_broker_sets():
    """Every variable the launch request sets for the attempt is in the list."""
    assert set(NAMES) <= protocol.PER_ATTEMPT_ENV
    assert {v for k, v in vars(protocol).items() if k.startswith("ENV_")} <= protocol.PER_ATTEMPT_ENV


def test_a_job_stored_before_cannot_set_them_at_launch_either(factory, settings):
    """A spec stored before these names were refused: the launch request (and
    the spec a SkyPilot node's Task is built from) carry the broker's values."""
    from spotbroker.broker import auth
    from spotbroker.broker.jobs.spec import JobSpec
    from spotbroker.broker.launch.request import launch_request
    from spotbroker.broker.pricing.offers import LOCAL_PLACEMENT
    from spotbroker.broker.reconciler import Reconciler
    from spotbroker.broker.store import sealing
    from spotbroker.broker.store.db import transaction
    from spotbroker.broker.store.models import Attempt, Job
    from spotbroker.broker.usecases import jobs

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    other = "file:///var/lib/spotbroker/checkpoints/a/1/1/step-000000000100"
    with transaction(factory) as s:
        team, _ = auth.create_team(s, "b")
        job = jobs.submit(s, team.id, JobSpec.model_validate({
            "run": "true", "envs": {"CHECKPOINT_URI": other, "A": "1"},
            "secrets": {"RESUME_FROM": other, "SPOTBROKER_CODE_URI": other, "B": "2"}}),
            keyring=sealing.keyring(settings))
        job_id = job.id
    with transaction(factory) as s:
        job = s.get(Job, job_id)
        attempt = Reconciler(factory, {}, settings).launching.new_attempt(
            s, job, JobSpec.model_validate(job.spec), LOCAL_PLACEMENT, "local", "t")
        attempt_id = attempt.id
    with factory() as s:
        request = launch_request(s, s.get(Attempt, attempt_id), settings, settings.signing_key())
    assert request.envs == {"A": "1"} and request.secrets == {"B": "2"}
    assert request.spec.envs == {"A": "1"} and request.spec.secret_values() == {"B": "2"}
    assert request.extra_env[protocol.ENV_RESUME_FROM] == "" and other not in request.extra_env.values()


def test_a_local_nodes_simulated_cloud_takes_orders_from_the_broker_only(api, team_headers, settings, factory):
    """Another team's job on the same host finds a node's metadata simulator
    by its port (listening sockets are in the world-readable /proc/net/tcp)
    and orders a preemption notice: refused. The broker's own
    `simulate-preemption` still works."""
    import httpx
    from support.helpers import wait_for, wait_state

    h = team_headers("a")
    job_id = api.post("/v1/jobs", json={"run": "sleep 120", "resources": {"accelerators": "T4:1"}},
                      headers=h).json()["id"]
    job = wait_state(api, h, job_id, {"RUNNING"}, timeout=60)
    run_dir = settings.data_dir / "runs" / str(job["attempts"][-1]["id"])
    sim = run_dir / "sim.url"  # where the node's simulator says its URL; a port scan finds it as well
    url = wait_for(lambda: sim.exists() and "\n" in sim.read_text() and sim.read_text().split("\n", 1)[0].strip(),
                   timeout=30, what="the node's simulator")
    for method, path in (("POST", "/_sim/preempt"), ("POST", "/_sim/fault"), ("GET", "/_sim/state")):
        r = httpx.request(method, url + path, json={"mode": "500"} if path.endswith("fault") else {}, timeout=5)
        assert r.status_code == 403, (path, r.text)
    assert httpx.request("POST", url + "/_sim/preempt", headers={"X-Sim-Token": "guess"}, timeout=5).status_code == 403
    assert api.get(f"/v1/jobs/{job_id}", headers=h).json()["state"] == "RUNNING"
    assert api.post(f"/v1/jobs/{job_id}/simulate-preemption", headers=h).status_code == 202
    # The notice is the proof; the states it causes can pass in under 100 ms,
    # too fast for a poll to see, when the job resumes at once.
    wait_for(lambda: any(e["type"] == "preemption_notice"
                         for e in api.get(f"/v1/jobs/{job_id}/events", headers=h).json()["events"]),
             timeout=30, what="the broker's own notice to reach the job")
    api.post(f"/v1/jobs/{job_id}/cancel", headers=h)
    # A reclaim the team asked for: marked so, it steers no other team's placement (placement/histories.py).
    from spotbroker.broker.store.models import Attempt

    with factory() as s:
        assert s.get(Attempt, job["attempts"][-1]["id"]).preemption_requested


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_simulated_preemption_is_taken_when_another_writer_comes_in_between(api, team_headers, settings):
    """The request read the job, then marked its attempt: on SQLite a read
    transaction that then writes fails at once when another writer (an
    agent's report, the reconciler) committed in between, and the answer was
    503 "the database did not answer" (two runs of the suite under load)."""
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from support.helpers import wait_state

    h = team_headers("a")
    job_id = api.post("/v1/jobs", json={"run": "sleep 120"}, headers=h).json()["id"]
    wait_state(api, h, job_id, {"RUNNING"}, timeout=60)
    path = settings.sqlalchemy_url.removeprefix("sqlite:///")

    def another_writer(conn, cursor, statement, *args) -> None:
        if statement.startswith("UPDATE attempts SET preemption_requested"):
            other = sqlite3.connect(path, timeout=0.2)
            try:  # (it waits for the lock when the request already holds it)
                other.execute("UPDATE teams SET name = name WHERE id = 1")
                other.commit()
            except sqlite3.OperationalError:
                pass
            finally:
                other.close()

    event.listen(Engine, "before_cursor_execute", another_writer)
    try:
        answer = api.post(f"/v1/jobs/{job_id}/simulate-preemption", headers=h)
    finally:
        event.remove(Engine, "before_cursor_execute", another_writer)
    assert answer.status_code == 202, answer.text
    api.post(f"/v1/jobs/{job_id}/cancel", headers=h)


@pytest.mark.parametrize("route", ["events", "prices", "dashboard"])
def test_a_teams_flood_takes_at_most_its_turns_and_the_others_are_answered(api, team_headers, monkeypatch, route):
    """Team b sent hundreds of costly reads at once: they took every thread
    and pooled connection, and team a's requests and the agents' heartbeats
    waited 30 s, then got 500s. A team's requests now run at most
    SPOTBROKER_MAX_REQUESTS_PER_TEAM (16) at once; the rest wait their turn.
    Every authenticated route takes a turn: `GET /v1/prices` and the
    dashboard's pages did not, and 64 connections of one team held the
    others' reads for 9 s."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from spotbroker.api.routers import prices
    from spotbroker.broker.money import dashboard
    from spotbroker.broker.usecases import jobs

    a, b = team_headers("a"), team_headers("b")
    job_id = api.post("/v1/jobs", json={"run": "true"}, headers=b).json()["id"]
    module, name, path = {"events": (jobs, "events", f"/v1/jobs/{job_id}/events"),
                          "prices": (prices, "ranked_prices", "/v1/prices?limit=5"),
                          "dashboard": (dashboard, "team_page", "/dashboard/teams/b")}[route]
    real, lock, now, peak = getattr(module, name), threading.Lock(), 0, 0

    def slow(*args, **kwargs):
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)
        time.sleep(2)  # a costly read, holding its thread and its connection
        with lock:
            now -= 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, slow)
    with ThreadPoolExecutor(60) as pool:  # more than the server's 40 threads
        flood = [pool.submit(api.get, path, headers=b, timeout=60) for _ in range(60)]
        time.sleep(1)  # b's turns taken, the rest of its requests waiting
        started = time.monotonic()
        r = api.get("/v1/jobs", headers=a, timeout=30)
        waited = time.monotonic() - started
        answers = [f.result() for f in flood]
    assert r.status_code == 200 and waited < 1.5, f"team a waited {waited:.1f} s behind b's flood"
    assert [x.status_code for x in answers] == [200] * 60  # b's requests all answered, in turn
    assert peak == 16
