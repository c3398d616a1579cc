"""Budgets over the API: the admin sets one (targets are write-only
secrets), the team reads it redacted and cannot change it; over budget a
new job is HELD with the reason, and raising the budget releases it."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from conftest import ADMIN_TOKEN
from sqlalchemy import select
from support.helpers import spend_today, wait_state

from spotbroker.broker.store.db import make_engine, make_session_factory, transaction
from spotbroker.broker.store.models import Attempt, Job, Team

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SECRET = "http://127.0.0.1:9/services/T000/B000/very-secret-part"


def test_admin_sets_a_budget_the_team_reads_it_redacted_and_cannot_change_it(api, team_headers, settings):
    settings.notify_allowed_networks = ["127.0.0.0/8"]  # the receiver of this test is local
    a = team_headers("a")
    body = {"amount": 5000, "period": "month", "targets": [{"name": "slack", "kind": "webhook", "url": SECRET}]}
    assert api.put("/v1/teams/a/budget", json=body, headers=a).status_code == 403
    bad = api.put("/v1/teams/a/budget", json={"amount": 5, "targets": [{"name": "x", "kind": "webhook"}]},
                  headers=ADMIN)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "targets.0.url"
    bad = api.put("/v1/teams/a/budget", json={"amount": -1}, headers=ADMIN)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "amount"
    for amount, says in ((True, "valid number"), ("NaN", "finite")):  # `true` was a $1 budget
        bad = api.put("/v1/teams/a/budget", content=f'{{"amount": {json.dumps(amount)}}}'.replace('"NaN"', "NaN"),
                      headers={**ADMIN, "Content-Type": "application/json"})
        (err,) = bad.json()["errors"]
        assert bad.status_code == 422 and err["field"] == "amount" and says in err["message"], bad.text
    twice = {**body["targets"][0]}
    bad = api.put("/v1/teams/a/budget", json={**body, "targets": [twice, twice]}, headers=ADMIN)
    assert bad.status_code == 422 and "given twice" in bad.json()["errors"][0]["message"], bad.text
    assert api.put("/v1/teams/nobody/budget", json=body, headers=ADMIN).status_code == 404
    r = api.put("/v1/teams/a/budget", json=body, headers=ADMIN)
    assert r.status_code == 200 and SECRET not in r.text and "very-secret" not in r.text
    assert r.json()["targets"] == [{"name": "slack", "kind": "webhook", "hint": "127.0.0.1 …part"}]
    assert r.json()["hard_cap_action"] == "hold_new" and r.json()["rules"]["committed_hours"] == 24
    mine = api.get("/v1/teams/a/budget", headers=a)
    assert mine.status_code == 200 and mine.json()["targets"] == [{"name": "slack", "kind": "webhook", "hint": None}]
    assert mine.json()["amount"] == 5000 and mine.json()["over"] is False
    assert api.get("/v1/teams/b/budget", headers=a).status_code == 403
    assert api.get("/v1/alerts", headers=a).json() == {"alerts": []}
    assert api.get("/v1/alerts", params={"team": "b"}, headers=a).status_code == 403


def test_over_budget_a_new_job_is_held_and_raising_the_budget_releases_it(api, team_headers, settings):
    a = team_headers("a")
    spend_today(settings, "a", 10.0)
    r = api.put("/v1/teams/a/budget", json={"amount": 5, "period": "day"}, headers=ADMIN)
    assert r.json()["over"] is True and r.json()["spent"] >= 10.0
    job = api.post("/v1/jobs", json={"name": "next", "run": "echo ran"}, headers=a).json()
    held = wait_state(api, a, job["id"], {"HELD"})
    assert held["reason"].startswith("over budget: $10.00 spent of $5.00 this day")
    api.put("/v1/teams/a/budget", json={"amount": 500, "period": "day"}, headers=ADMIN)
    done = wait_state(api, a, job["id"], {"SUCCEEDED", "FAILED"}, timeout=30)
    assert done["state"] == "SUCCEEDED"
    moves = [(e["data"]["from"], e["data"]["to"]) for e in api.get(f"/v1/jobs/{job['id']}/events",
                                                                     headers=a).json()["events"]
             if e["type"] == "job_state"]
    assert moves[:2] == [("PENDING", "HELD"), ("HELD", "PENDING")]


def test_a_new_amount_keeps_the_write_only_targets_unless_they_are_sent(api, team_headers, settings):
    """Targets are write-only: a client that changes the amount cannot send
    them back, so a PUT without `targets` keeps them (`[]` clears them)."""
    settings.notify_allowed_networks = ["127.0.0.0/8"]  # the target of this test is local
    team_headers("a")
    first = {"amount": 100, "targets": [{"name": "slack", "kind": "webhook", "url": SECRET}]}
    assert api.put("/v1/teams/a/budget", json=first, headers=ADMIN).status_code == 200
    raised = api.put("/v1/teams/a/budget", json={"amount": 200}, headers=ADMIN)
    assert raised.status_code == 200 and raised.json()["amount"] == 200
    assert [t["name"] for t in raised.json()["targets"]] == ["slack"]
    cleared = api.put("/v1/teams/a/budget", json={"amount": 200, "targets": []}, headers=ADMIN)
    assert cleared.json()["targets"] == []
    tiny = api.put("/v1/teams/a/budget", json={"amount": 1e-300}, headers=ADMIN)
    assert tiny.status_code == 422 and tiny.json()["errors"][0]["field"] == "amount"


def test_only_the_admin_silences_a_budgets_alerts_and_a_team_reads_its_own_silences(api, team_headers):
    """Budgets and the targets they notify are the admin's: a team's token
    cannot mute them (403, its own team's too), but it sees what is muted."""
    a, b = team_headers("a"), team_headers("b")
    body = {"team": "a", "rule": "fast_burn", "minutes": 90}
    r = api.post("/v1/alerts/silences", json=body, headers=a)
    assert r.status_code == 403 and "admin" in r.json()["detail"]
    assert api.post("/v1/alerts/silences", json=body, headers=b).status_code == 403
    assert api.get("/v1/alerts/silences", headers=a).json() == {"silences": []}   # nothing was written
    for rule in ("everything", "spend_...", "spend_1.2.3"):  # (the dots were a silence of nothing)
        bad = api.post("/v1/alerts/silences", json={**body, "rule": rule}, headers=ADMIN)
        assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "rule", rule
    assert api.post("/v1/alerts/silences", json={**body, "team": "nobody"}, headers=ADMIN).status_code == 404
    made = api.post("/v1/alerts/silences", json=body, headers=ADMIN)
    assert made.status_code == 201 and made.json()["team"] == "a" and made.json()["rule"] == "fast_burn"
    mine = api.get("/v1/alerts/silences", headers=a).json()["silences"]
    assert [s["id"] for s in mine] == [made.json()["id"]]
    assert api.get("/v1/alerts/silences", headers=b).json() == {"silences": []}
    assert api.get("/v1/alerts/silences", params={"team": "a"}, headers=b).status_code == 403
    path = f"/v1/alerts/silences/{made.json()['id']}"
    assert api.delete(path, headers=a).status_code == 403
    ended = api.delete(path, headers=ADMIN)
    assert ended.status_code == 200 and ended.json()["until"] < made.json()["until"]
    assert api.get("/v1/alerts/silences", headers=a).json() == {"silences": []}
    (old,) = api.get("/v1/alerts/silences", params={"expired": "true"}, headers=a).json()["silences"]
    assert old["id"] == made.json()["id"]
    assert api.delete("/v1/alerts/silences/999999", headers=ADMIN).status_code == 404


def test_an_open_alerts_figures_are_read_now_and_its_history_kept(api, team_headers, settings):
    """The text an alert fired with stayed its text ("27.7x" while the page
    said "282.7x"): /v1/alerts now answers an open alert's figures as they
    are, and keeps what it fired with."""
    from spotbroker.broker.money import alerts
    from spotbroker.broker.money.budgets import period_of

    a = team_headers("a")
    now = datetime.now(UTC)
    # the forecast is what is spent plus the rate until the period's end: the period with the most time left
    # (the month alone had 23.5 h left on the 30th of November, and the forecast fell under 25 $/h x 24 h)
    period = max(("day", "week", "month"), key=lambda kind: period_of(kind, now).end)
    assert period_of(period, now).end - now > timedelta(hours=3), "every period ends within 3 h: run it later"
    assert api.put("/v1/teams/a/budget", json={"amount": 10, "period": period}, headers=ADMIN).status_code == 200
    engine = make_engine(settings.sqlalchemy_url)
    factory = make_session_factory(engine)

    def running(price: float) -> None:
        with transaction(factory) as s:
            team = s.scalar(select(Team.id).where(Team.name == "a"))
            job = Job(team_id=team, name=f"run{price:g}", state="RUNNING", spec={"name": "r", "run": "true"},
                      restarts=0, recoveries=0, created_at=now, updated_at=now)
            s.add(job)
            s.flush()
            s.add(Attempt(job_id=job.id, state="RUNNING", launcher="local", cloud="aws", region="us-east-1",
                          use_spot=False, num_nodes=1, price_per_hour=price, created_at=now, updated_at=now,
                          started_at=now - timedelta(minutes=10), accelerator_count=0))

    try:
        running(5.0)
        with transaction(factory) as s:
            alerts.evaluate(s, datetime.now(UTC))
        running(20.0)
    finally:
        engine.dispose()
    (forecast,) = [x for x in api.get("/v1/alerts", headers=a).json()["alerts"] if x["rule"] == "forecast"]
    assert "$25.00/h" in forecast["summary"] and "$5.00/h" in forecast["fired_summary"]
    assert [e["kind"] for e in forecast["history"]] == ["fire"] and "$5.00/h" in forecast["history"][0]["summary"]
    assert forecast["value"] > forecast["history"][0]["value"] and forecast["state"] == "open"  # 25 $/h, not 5
    assert datetime.fromisoformat(forecast["as_of"]) >= now
    # the budget raised: still open (a rate's alert waits out its hold), no longer holding, and said so with
    # the time of its figures (they were answered as read now: "1819.6x" when the burn was 0.1x)
    assert api.put("/v1/teams/a/budget", json={"amount": 100_000, "period": period}, headers=ADMIN).status_code == 200
    (forecast,) = [x for x in api.get("/v1/alerts", headers=a).json()["alerts"] if x["rule"] == "forecast"]
    fired = datetime.fromisoformat(forecast["history"][-1]["at"])
    assert forecast["state"] == "open" and datetime.fromisoformat(forecast["as_of"]) == fired, forecast
    assert forecast["summary"] == f"no longer holds; at {fired:%H:%M} UTC it read: {forecast['fired_summary']}"
