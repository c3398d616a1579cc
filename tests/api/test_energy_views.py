"""Energy and emissions next to dollars (issue 29): a job's and its
attempts' kWh and CO2e in GET /v1/jobs/{id}, with the grid figure and
whether the power was measured, and per 1,000 steps and per epoch from what
the trainer reported; the costs API's rows and total, and its CSV. A team
reads only its own."""
from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from spotbroker.broker.store.db import make_engine, make_session_factory, transaction
from spotbroker.broker.store.metricmodels import MetricPoint
from spotbroker.broker.store.models import Attempt, Checkpoint, Job, Team


def seed(settings, team: str, name: str, places: list[tuple], hours_ago: float = 5.0,
         steps: list[tuple[int, str, float]] = (), checkpoint_step: int | None = None) -> int:
    """A job with an ended attempt per place (region, power_kw, g/kWh, basis,
    nodes) each running an hour, one after the other from `hours_ago`; and
    its metric points (step, name, value) and a checkpoint."""
    engine = make_engine(settings.sqlalchemy_url)
    start = datetime.now(UTC) - timedelta(hours=hours_ago)
    with transaction(make_session_factory(engine)) as s:
        team_id = s.scalar(select(Team.id).where(Team.name == team))
        job = Job(team_id=team_id, name=name, state="SUCCEEDED", spec={"name": name, "run": "true"}, restarts=0,
                  recoveries=0, created_at=start, updated_at=start, ended_at=start + timedelta(hours=len(places)))
        s.add(job)
        s.flush()
        for i, (region, kw, grid, basis, nodes) in enumerate(places):
            begin, end = start + timedelta(hours=i), start + timedelta(hours=i + 1)
            a = Attempt(job_id=job.id, state="SUCCEEDED", launcher="local", cloud="aws", region=region,
                        zone_id=None, instance_type="p4d.24xlarge", accelerator="A100", accelerator_count=8,
                        use_spot=True, num_nodes=nodes, price_per_hour=2.0, created_at=begin, updated_at=end,
                        started_at=begin, ended_at=end, end_reason="succeeded", released=True, power_kw=kw,
                        grid_g_per_kwh=grid, grid_source="test-source", energy_basis=basis)
            s.add(a)
            s.flush()
            for step, metric, value in steps:
                s.add(MetricPoint(job_id=job.id, attempt_id=a.id, step=step, name=metric, value=value, at=end))
            if checkpoint_step is not None:
                s.add(Checkpoint(job_id=job.id, attempt_id=a.id, step=checkpoint_step, uri="file:///c", bytes=1,
                                 committed_at=end))
            steps, checkpoint_step = (), None
        job_id = job.id
    engine.dispose()
    return job_id


def test_a_job_shows_its_energy_per_attempt_and_per_step_and_epoch(api, team_headers, settings):
    a, b = team_headers("a"), team_headers("b")
    job = seed(settings, "a", "train", [("eu-north-1", 4.0, 50.0, "measured", 2), ("us-east-1", 5.0, 400.0,
               "estimated", 1)], steps=[(1500, "loss", 0.5), (1500, "epoch", 2.0)], checkpoint_step=2000)
    r = api.get(f"/v1/jobs/{job}", headers=a)
    assert r.status_code == 200, r.text
    first, second = (x["energy"] for x in r.json()["attempts"])
    assert first == pytest.approx({"kwh": 8.0, "co2e_kg": 0.4, "power_kw": 4.0, "grid_g_per_kwh": 50.0,
                                   "grid_source": "test-source", "basis": "measured"})
    assert second["kwh"] == pytest.approx(5.0) and second["co2e_kg"] == pytest.approx(2.0)
    assert second["basis"] == "estimated"
    energy = r.json()["energy"]
    assert energy["kwh"] == pytest.approx(13.0) and energy["co2e_kg"] == pytest.approx(2.4)
    assert energy["kwh_per_1000_steps"] == pytest.approx(13.0 / 2)   # the checkpoint reached step 2000
    assert energy["kwh_per_epoch"] == pytest.approx(13.0 / 2)
    assert api.get(f"/v1/jobs/{job}", headers=b).status_code == 404
    bare = seed(settings, "a", "bare", [("us-east-1", 1.0, 100.0, "estimated", 1)])
    got = api.get(f"/v1/jobs/{bare}", headers=a).json()["energy"]
    assert got["kwh"] == pytest.approx(1.0) and got["kwh_per_1000_steps"] is None and got["kwh_per_epoch"] is None


def test_the_costs_api_sums_energy_by_every_grouping_and_in_its_csv(api, team_headers, settings):
    a, b = team_headers("a"), team_headers("b")
    seed(settings, "a", "one", [("eu-north-1", 4.0, 50.0, "estimated", 2)], hours_ago=30)   # 8 kWh, 0.4 kg
    seed(settings, "a", "two", [("us-east-1", 5.0, 400.0, "estimated", 1)])                 # 5 kWh, 2 kg
    seed(settings, "b", "theirs", [("us-east-1", 100.0, 900.0, "estimated", 1)])
    total = api.get("/v1/teams/a/costs", headers=a).json()["total"]
    assert total["kwh"] == pytest.approx(13.0) and total["co2e_kg"] == pytest.approx(2.4)
    assert total["cost"] == pytest.approx(6.0)   # the dollars are still there
    for group_by in ("day", "job", "cloud", "gpu", "zone", "label:project"):
        groups = api.get("/v1/teams/a/costs", params={"group_by": group_by}, headers=a).json()["groups"]
        assert sum(g["kwh"] for g in groups) == pytest.approx(13.0), group_by
        assert sum(g["co2e_kg"] for g in groups) == pytest.approx(2.4), group_by
    by_job = api.get("/v1/teams/a/costs", params={"group_by": "job"}, headers=a).json()["groups"]
    assert {g["name"]: (g["kwh"], g["co2e_kg"]) for g in by_job} == {"one": pytest.approx((8.0, 0.4)),
                                                                    "two": pytest.approx((5.0, 2.0))}
    r = api.get("/v1/teams/a/costs.csv", params={"group_by": "job"}, headers=a)
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert {row["name"]: (float(row["kwh"]), float(row["co2e_kg"])) for row in rows} == {
        "one": pytest.approx((8.0, 0.4)), "two": pytest.approx((5.0, 2.0))}
    assert float(rows[0]["cost"]) == pytest.approx(4.0)
    assert api.get("/v1/teams/b/costs", headers=a).status_code == 403
    assert api.get("/v1/teams/b/costs", headers=b).json()["total"]["kwh"] == pytest.approx(100.0)
