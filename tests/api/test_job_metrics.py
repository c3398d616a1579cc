"""Metrics through the agent channel: stored per attempt, folded and
bounded; the early_stop rule judged on them; GET /v1/jobs/{id}/metrics
scoped to the job's team."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

from support.helpers import counted, post, wait_state

from spotbroker.broker.recovery.agent_channel import agent_token

RULE = {"metric": "val_loss", "mode": "min", "patience": 2, "min_delta": 0.01, "min_steps": 10}
T0 = datetime.now(UTC)


def report(seq: int, step: int, seconds: float, run: dict | None = None, **values: float) -> dict:
    """A metrics event as the agent forwards it, at T0 + seconds (the agent's clock);
    with `run` (the library's state), counted under RULE as the library counts."""
    at = (T0 + timedelta(seconds=seconds)).isoformat()
    data = {"step": step, "values": values}
    return {"seq": seq, "type": "metrics", "at": at, "data": data if run is None else counted(RULE, run, data)}


def started(api, h, settings, **spec) -> tuple[dict, str]:
    job_id = api.post("/v1/jobs", json={"run": "sleep 60", **spec}, headers=h).json()["id"]
    job = wait_state(api, h, job_id, {"RUNNING"}, timeout=60)
    return job, agent_token(settings.signing_key(), job["attempts"][-1]["id"])


def test_a_plateau_fires_the_rule_and_the_job_ends_early_stopped(api, team_headers, settings):
    h = team_headers()
    job, token = started(api, h, settings, early_stop=RULE)
    curve = [(5, 9.0), (10, 1.0), (20, 0.5), (30, 0.6)]  # step 5 is before min_steps
    run: dict = {}
    answer = post(api, token, *[report(100 + i, step, 5 * i, run, val_loss=v, acc=step / 100)
                                for i, (step, v) in enumerate(curve)]).json()
    assert answer["stop"] is False  # one report since the best: patience is 2
    assert api.get(f"/v1/jobs/{job['id']}", headers=h).json()["early_stop"] is None
    answer = post(api, token, report(110, 40, 50, run, val_loss=0.495)).json()  # not better by min_delta
    assert answer["stop"] is True and answer["cancel"] is False
    fired = api.get(f"/v1/jobs/{job['id']}", headers=h).json()
    assert fired["state"] == "RUNNING"
    assert (fired["early_stop"]["best_step"], fired["early_stop"]["best_value"]) == (20, 0.5)

    series = api.get(f"/v1/jobs/{job['id']}/metrics", headers=h).json()
    assert [p["step"] for p in series["metrics"]["val_loss"]] == [5, 10, 20, 30, 40]
    assert [p["value"] for p in series["metrics"]["acc"]][-1] == 0.3 and series["early_stop"] == RULE
    assert api.get(f"/v1/jobs/{job['id']}/metrics", headers=team_headers("other")).status_code == 404

    # The trainer has no library: the agent says no flush will come, and the job ends all the same.
    answer = post(api, token, {"seq": 111, "type": "no_flush", "at": datetime.now(UTC).isoformat(),
                               "data": {"reason": "no library", "early_stop": True}}).json()
    assert answer["cancel"] is True
    done = wait_state(api, h, job["id"], {"SUCCEEDED", "FAILED", "CANCELLED"})
    assert (done["state"], done["reason"]) == ("SUCCEEDED", "early_stopped")
    assert (done["attempts"][-1]["state"], done["attempts"][-1]["reason"]) == ("SUCCEEDED", "early_stopped")
    stop = done["early_stop"]
    assert stop["done"] and stop["stopped_step"] == 40 and stop["checkpoint"] is None
    assert stop["dollars_saved"] is None and "no saving can be computed" in stop["saving"]
    assert stop["hours_run"] > 0


def test_without_the_rule_a_plateau_stops_nothing(api, team_headers, settings):
    h = team_headers()
    job, token = started(api, h, settings)
    answer = post(api, token, *[report(100 + i, 10 * i, 5 * i, val_loss=1.0) for i in range(10)]).json()
    assert answer["stop"] is False
    assert api.get(f"/v1/jobs/{job['id']}", headers=h).json()["state"] == "RUNNING"
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_reports_too_close_together_are_folded_and_names_are_bounded(api, team_headers, settings):
    h = team_headers()
    job, token = started(api, h, settings)
    # Three reports within a second of each other: one point, the newest.
    post(api, token, report(100, 1, 0.0, loss=3.0), report(101, 2, 0.5, loss=2.0), report(102, 3, 1.0, loss=1.0))
    many = {f"m{i}": float(i) for i in range(40)}
    post(api, token, report(103, 4, 10.0, **many))
    post(api, token, report(104, 5, 20.0, **{"bad name": 1.0, "loss": 0.5}))
    series = api.get(f"/v1/jobs/{job['id']}/metrics", headers=h).json()["metrics"]
    assert [(p["step"], p["value"]) for p in series["loss"]] == [(3, 1.0), (5, 0.5)]
    assert len(series) == 32  # loss and 31 of the 40 others
    events = api.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["events"]
    dropped = [e["data"]["reason"] for e in events if e["type"] == "metrics_dropped"]
    assert len(dropped) == 2 and any("32 metric names" in d for d in dropped)
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_early_stop_is_validated_naming_the_field(api, team_headers):
    h = team_headers()
    for bad, field in (({"mode": "min"}, "metric"), ({"metric": "val_loss", "mode": "lowest"}, "mode"),
                       ({"metric": "val_loss", "patience": 0}, "patience"),
                       ({"metric": "val_loss", "typo": 1}, "typo"), ({"metric": "bad name"}, "metric")):
        r = api.post("/v1/jobs", json={"run": "true", "early_stop": bad}, headers=h)
        assert r.status_code == 422, r.text
        assert any(e["field"] == f"early_stop.{field}" for e in r.json()["errors"]), r.json()
    task = b"run: python train.py\nearly_stop:\n  metric: val_loss\n  patience: -1\n"
    r = api.post("/v1/jobs", content=task, headers={**h, "Content-Type": "application/yaml"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "early_stop.patience", r.text
    ok = b"run: python train.py\nearly_stop: {metric: val_loss, patience: 3, min_steps: 1000}\n"
    r = api.post("/v1/jobs", content=ok, headers={**h, "Content-Type": "application/yaml"})
    assert r.status_code == 201 and r.json()["spec"]["early_stop"]["min_steps"] == 1000, r.text
    api.post(f"/v1/jobs/{r.json()['id']}/cancel", headers=h)


def test_without_a_best_save_the_first_checkpoint_at_or_after_the_best_step_is_named(api, team_headers, settings):
    """The library saved no `best` checkpoint (its upload was busy, or it is
    not the library): the broker names the first committed at or after the
    best step, and says that is how it was chosen. Here it cannot be read
    back from storage (the agent reported it, nothing wrote it): it is named
    but not kept, and an event says why."""
    h = team_headers()
    job, token = started(api, h, settings, early_stop={**RULE, "min_steps": 0})
    prefix = f"{settings.checkpoint_uri}/ml/{job['id']}/{job['attempts'][-1]['id']}"

    def committed(seq: int, step: int) -> dict:
        return {"seq": seq, "type": "checkpoint_committed", "at": datetime.now(UTC).isoformat(), "data": {
            "step": step, "uri": f"{prefix}/step-{step:012d}", "bytes": 10, "seconds": 0.1, "reason": "periodic"}}

    run: dict = {}
    post(api, token, committed(100, 10), report(101, 10, 0, run, val_loss=1.0), report(102, 20, 5, run, val_loss=0.5),
         committed(103, 30), committed(104, 60), report(105, 40, 10, run, val_loss=0.6),
         report(106, 50, 15, run, val_loss=0.7))
    answer = post(api, token, {"seq": 107, "type": "no_flush", "at": datetime.now(UTC).isoformat(),
                               "data": {"reason": "no library", "early_stop": True}}).json()
    assert answer["cancel"] is True
    stop = wait_state(api, h, job["id"], {"SUCCEEDED", "FAILED", "CANCELLED"})["early_stop"]
    assert stop["best_step"] == 20 and stop["checkpoint"]["step"] == 30 and stop["checkpoint"]["choice"] == "after_best"
    checkpoints = api.get(f"/v1/jobs/{job['id']}/checkpoints", headers=h).json()["checkpoints"]
    assert not any(c["keep"] for c in checkpoints)
    events = api.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["events"]
    assert [e["data"]["checkpoint_id"] for e in events if e["type"] == "keep_refused"] == [stop["checkpoint"]["id"]]


def test_a_best_save_after_the_rule_fired_is_not_the_kept_one(api, team_headers, settings):
    """The trainer goes on until the stop reaches it, and a report in that
    time may beat the best: the library saves it as `best` too, but the rule
    has judged; the kept checkpoint is the best step's (a loaded machine kept
    step 790 against a best step of 750)."""
    h = team_headers()
    job, token = started(api, h, settings, early_stop={**RULE, "min_steps": 0})
    prefix = f"{settings.checkpoint_uri}/ml/{job['id']}/{job['attempts'][-1]['id']}"

    def committed(seq: int, step: int) -> dict:
        return {"seq": seq, "type": "checkpoint_committed", "at": datetime.now(UTC).isoformat(), "data": {
            "step": step, "uri": f"{prefix}/step-{step:012d}", "bytes": 10, "seconds": 0.1, "reason": "best"}}

    run: dict = {}
    post(api, token, report(100, 10, 0, run, val_loss=1.0), report(101, 20, 5, run, val_loss=0.5), committed(102, 20),
         report(103, 40, 10, run, val_loss=0.6), report(104, 50, 15, run, val_loss=0.7))
    fired = api.get(f"/v1/jobs/{job['id']}", headers=h).json()["early_stop"]
    assert fired is not None and fired["best_step"] == 20
    post(api, token, report(105, 70, 20, run, val_loss=0.3), committed(106, 70))  # the stop on its way
    post(api, token, {"seq": 107, "type": "no_flush", "at": datetime.now(UTC).isoformat(),
                      "data": {"reason": "no library", "early_stop": True}})
    stop = wait_state(api, h, job["id"], {"SUCCEEDED", "FAILED", "CANCELLED"})["early_stop"]
    assert (stop["best_step"], stop["checkpoint"]["step"], stop["checkpoint"]["choice"]) == (20, 20, "best")


def test_an_agents_backlog_of_reports_is_stored_in_a_few_statements(engine, factory):
    """A batch of a thousand reports (an agent's backlog) was three queries and a
    flush a report, under SQLite's write lock for seconds: the batch is now a few
    statements whatever its size, folded and bounded as before."""
    from sqlalchemy import event, select
    from support.world import T0 as START
    from support.world import World

    from spotbroker.broker.recovery import agent_channel
    from spotbroker.broker.recovery.agent_channel import AgentEvent
    from spotbroker.broker.store.db import transaction
    from spotbroker.broker.store.metricmodels import MetricPoint
    from spotbroker.broker.store.models import Attempt

    world = World(factory)
    attempt_id = world.attempt(world.job(world.team()))
    events = [AgentEvent(seq=i, type="metrics", at=START + timedelta(seconds=3 * i),
                         data={"step": i, "values": {"loss": 1.0 / i, "acc": i / 300}}) for i in range(1, 301)]
    # A second after the last report: folded onto its point, as the agent folds.
    events.append(AgentEvent(seq=301, type="metrics", at=START + timedelta(seconds=901),
                             data={"step": 301, "values": {"loss": 0.001}}))
    statements: list[str] = []

    def seen(conn, cursor, statement, *_):
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        with transaction(factory) as s:
            agent_channel.record(s, s.get(Attempt, attempt_id), events, "file:///nowhere")
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert len([q for q in statements if "metric_points" in q]) <= 6, len(statements)
    with factory() as s:
        points = s.execute(select(MetricPoint.name, MetricPoint.step, MetricPoint.value)
                           .order_by(MetricPoint.id)).all()
    assert len(points) == 600
    assert [tuple(p) for p in points[-2:]] == [("loss", 301, 0.001), ("acc", 300, 1.0)]


def test_a_jobs_points_are_bounded_across_its_attempts(factory, monkeypatch):
    """Each attempt kept its own 10,000 points, so a job its team preempted a thousand
    times (`simulate-preemption`, max_restarts 1000) kept ten million, all listed by
    GET .../metrics: the job's points are bounded too, and what is dropped is said."""
    from sqlalchemy import func, select
    from support.world import T0 as START
    from support.world import World

    from spotbroker.broker.jobs import metrics
    from spotbroker.broker.store.db import transaction
    from spotbroker.broker.store.metricmodels import MetricPoint
    from spotbroker.broker.store.models import Attempt, Event, Job

    monkeypatch.setattr(metrics, "MAX_POINTS_PER_ATTEMPT", 4)
    monkeypatch.setattr(metrics, "MAX_POINTS_PER_JOB", 6)
    world = World(factory)
    job_id = world.job(world.team())
    attempts = [world.attempt(job_id, end=START + timedelta(hours=1), end_reason="preempted"),
                world.attempt(job_id, start=START + timedelta(hours=1))]
    for n, attempt_id in enumerate(attempts):
        reports = [({"step": i, "values": {"loss": 1.0 / i}}, START + timedelta(hours=n, seconds=10 * i))
                   for i in range(1, 6)]
        with transaction(factory) as s:
            metrics.record_many(s, s.get(Job, job_id), s.get(Attempt, attempt_id), reports, START)
    with factory() as s:
        kept = dict(s.execute(select(MetricPoint.attempt_id, func.count()).group_by(MetricPoint.attempt_id)).all())
        told = [e.data["reason"] for e in s.scalars(select(Event).where(Event.type == metrics.DROPPED))]
    assert kept == {attempts[0]: 4, attempts[1]: 2}
    assert any("more than 4 points in the attempt" in r for r in told), told
    assert any("more than 6 points in the job" in r for r in told), told
