"""GET /v1/teams/{name}/costs: the ledger's numbers, exact to now, grouped;
a team reads only itself, the admin every team; bad parameters are 422s
naming the field. A job's own cost is the same number."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from conftest import ADMIN_TOKEN
from sqlalchemy import select

from spotbroker.broker.store.db import make_engine, make_session_factory, transaction
from spotbroker.broker.store.models import Attempt, Job, Team

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def seed_job(settings, team: str, name: str, hours_ago: float, hours: float, price: float, nodes: int = 1) -> int:
    """A job that ran `hours` ending `hours_ago - hours` ago (or still runs, with hours=None)."""
    engine = make_engine(settings.sqlalchemy_url)
    now = datetime.now(UTC)
    start = now - timedelta(hours=hours_ago)
    end = start + timedelta(hours=hours)
    with transaction(make_session_factory(engine)) as s:
        team_id = s.scalar(select(Team.id).where(Team.name == team))
        job = Job(team_id=team_id, name=name, state="SUCCEEDED", spec={"name": name, "run": "true"}, restarts=0,
                  recoveries=0, created_at=start, updated_at=end, ended_at=end)
        s.add(job)
        s.flush()
        s.add(Attempt(job_id=job.id, state="SUCCEEDED", launcher="local", cloud="aws", region="us-east-1",
                      zone_id="use1-az1", instance_type="p4d.24xlarge", accelerator="A100", accelerator_count=8,
                      use_spot=False, num_nodes=nodes, price_per_hour=price, created_at=start, updated_at=end,
                      started_at=start, ended_at=end, end_reason="succeeded", released=True))
        job_id = job.id
    engine.dispose()
    return job_id


def test_a_team_reads_its_costs_grouped_and_they_match_its_jobs(api, team_headers, settings):
    a, b = team_headers("a"), team_headers("b")
    j1 = seed_job(settings, "a", "first", hours_ago=30, hours=2, price=3.0, nodes=2)    # $12, yesterday
    j2 = seed_job(settings, "a", "second", hours_ago=3, hours=1, price=5.0)              # $5
    seed_job(settings, "b", "theirs", hours_ago=3, hours=1, price=100.0)
    r = api.get("/v1/teams/a/costs", headers=a)
    assert r.status_code == 200, r.text
    assert r.json()["total"]["cost"] == pytest.approx(17.0) and r.json()["currency"] == "USD"
    assert r.json()["groups"] == [] and r.json()["group_by"] is None
    by_job = api.get("/v1/teams/a/costs", params={"group_by": "job"}, headers=a).json()
    assert {g["name"]: g["cost"] for g in by_job["groups"]} == pytest.approx({"first": 12.0, "second": 5.0})
    assert api.get(f"/v1/jobs/{j1}", headers=a).json()["cost"] == pytest.approx(12.0)
    assert api.get(f"/v1/jobs/{j2}", headers=a).json()["attempts"][0]["cost"] == pytest.approx(5.0)
    for group_by in ("day", "cloud", "gpu", "zone"):
        got = api.get("/v1/teams/a/costs", params={"group_by": group_by}, headers=a).json()
        assert sum(g["cost"] for g in got["groups"]) == pytest.approx(17.0), group_by
    zone = api.get("/v1/teams/a/costs", params={"group_by": "zone"}, headers=a).json()["groups"]
    assert [g["key"] for g in zone] == ["aws/us-east-1/use1-az1"]
    since = (datetime.now(UTC) - timedelta(hours=10)).isoformat()
    recent = api.get("/v1/teams/a/costs", params={"since": since}, headers=a).json()
    assert recent["total"]["cost"] == pytest.approx(5.0)
    assert api.get("/v1/teams/b/costs", headers=b).json()["total"]["cost"] == pytest.approx(100.0)
    assert api.get("/v1/teams/b/costs", headers=ADMIN).json()["total"]["cost"] == pytest.approx(100.0)


def test_another_teams_costs_are_refused_and_bad_parameters_name_their_field(api, team_headers):
    a, _ = team_headers("a"), team_headers("b")
    assert api.get("/v1/teams/b/costs", headers=a).status_code == 403
    assert api.get("/v1/teams/nobody/costs", headers=a).status_code == 403   # existence is not told
    assert api.get("/v1/teams/nobody/costs", headers=ADMIN).status_code == 404
    assert api.get("/v1/teams/a/costs").status_code == 401
    for params, field in [({"group_by": "week"}, "group_by"), ({"since": "yesterday"}, "since"),
                          ({"since": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "until"),
                          ({"since": "2020-01-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "since"),
                          ({"until": "0001-01-01T00:00:00Z"}, "until"),
                          # offsets that take the calendar's first and last days past its ends
                          ({"until": "0001-01-01T00:00:00+14:00"}, "until"),
                          ({"since": "9999-12-31T23:59:59-14:00"}, "since"),
                          # a future since, until not given: since is what is wrong (it blamed until)
                          ({"since": "2999-01-01T00:00:00Z"}, "since"),
                          # the range under other names: it was the default thirty days, as if the answer
                          ({"from": "2027-01-01", "to": "2027-02-01"}, ["from", "to"])]:
        for path in ("/v1/teams/a/costs", "/v1/teams/a/costs.csv"):
            r = api.get(path, params=params, headers=a)
            assert r.status_code == 422, (path, params, r.text)
            assert [e["field"] for e in r.json()["errors"]] == (field if isinstance(field, list) else [field]), params
