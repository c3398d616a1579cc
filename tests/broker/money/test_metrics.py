"""/metrics: what Prometheus reads (parsed with prometheus_client's own
parser) equals what the database holds, for every team; and only the
metrics token or the admin token may scrape it."""
from __future__ import annotations

from datetime import timedelta

import pytest
from conftest import ADMIN_TOKEN
from prometheus_client import CollectorRegistry, generate_latest
from support.money import scrape, seed
from support.world import T0

from spotbroker.broker.metrics.collector import MoneyCollector
from spotbroker.broker.money.accrual import Accruer
from spotbroker.broker.money.settings import MoneySettings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt

H = timedelta(hours=1)


def test_the_scrape_reads_money_jobs_flushes_and_placements_from_the_database(factory, world, clock):
    seed(factory, world, clock)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MoneyCollector(factory, clock))
    got = scrape(generate_latest(registry).decode())

    ml, cv = (("team", "ml"),), (("team", "cv"),)
    assert got[("spotbroker_team_cost_month_dollars", ml)] == pytest.approx(12.0)   # 2 h x 2 nodes x $3
    assert got[("spotbroker_team_cost_month_dollars", cv)] == pytest.approx(1.0)
    assert got[("spotbroker_team_spend_rate_dollars_per_hour", ml)] == pytest.approx(6.0)
    even = 100 / (31 * 24)                                                          # March
    month = (("period", "month"), ("team", "ml"))
    assert got[("spotbroker_team_burn_rate_ratio", month)] == pytest.approx(6.0 / even)
    assert got[("spotbroker_team_budget_remaining_dollars", month)] == pytest.approx(88.0)
    assert ("spotbroker_team_budget_remaining_dollars", (("period", "month"), ("team", "cv"))) not in got
    assert got[("spotbroker_jobs", (("state", "RUNNING"), ("team", "ml")))] == 1
    assert got[("spotbroker_jobs", (("state", "PENDING"), ("team", "cv")))] == 1
    assert got[("spotbroker_preemptions_total", (("cloud", "gcp"), ("team", "cv")))] == 1
    assert got[("spotbroker_recoveries_total", cv)] == 1 and got[("spotbroker_recoveries_total", ml)] == 0
    # Flushes only (the periodic checkpoint is no flush): 3 s and 40 s.
    assert got[("spotbroker_checkpoint_flush_seconds_count", cv)] == 2
    assert got[("spotbroker_checkpoint_flush_seconds_sum", cv)] == pytest.approx(43.0)
    assert got[("spotbroker_checkpoint_flush_seconds_bucket", (("le", "5.0"), ("team", "cv")))] == 1
    assert got[("spotbroker_checkpoint_flush_seconds_bucket", (("le", "60.0"), ("team", "cv")))] == 2
    assert got[("spotbroker_placement_decisions_total",
                (("cloud", "aws"), ("market", "spot"), ("team", "ml")))] == 1
    assert got[("spotbroker_jobs_waiting_for_placement", cv)] == 1

    clock.advance(hours=1)   # another hour accrued: the next scrape says so, with nothing kept in memory
    Accruer(factory, MoneySettings(_env_file=None), clock=clock).accrue(clock.now())
    again = scrape(generate_latest(registry).decode())
    assert again[("spotbroker_team_cost_month_dollars", ml)] == pytest.approx(18.0)


def test_only_the_metrics_token_or_the_admin_token_scrapes(api, team_headers, monkeypatch):
    monkeypatch.setenv("SPOTBROKER_METRICS_TOKEN", "prometheus-scrape-secret")
    team = team_headers("ml")
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic YTpi"}):
        r = api.get("/metrics", headers=headers)
        assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json"
    r = api.get("/metrics", headers=team)
    assert r.status_code == 403 and "SPOTBROKER_METRICS_TOKEN" in r.json()["detail"]
    for token in ("prometheus-scrape-secret", ADMIN_TOKEN):
        r = api.get("/metrics", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert scrape(r.text)[("spotbroker_team_cost_month_dollars", (("team", "ml"),))] == 0.0
    schema = api.get("/openapi.json").json()["paths"]["/metrics"]["get"]["responses"]
    assert {"200", "401", "403"} <= set(schema)


def test_energy_and_emissions_are_counters_per_team(factory, world, clock):
    ml, cv = world.team("ml"), world.team("cv")
    running = world.attempt(world.job(ml, "big"), start=T0 - 2 * H, price=3.0, nodes=2)
    world.job(cv, "none")
    with transaction(factory) as s:
        a = s.get(Attempt, running)
        a.power_kw, a.grid_g_per_kwh = 3.0, 400.0
    Accruer(factory, MoneySettings(_env_file=None), clock=clock).accrue(clock.now())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MoneyCollector(factory, clock))
    got = scrape(generate_latest(registry).decode())
    # 2 h x 2 nodes x 3 kW = 12 kWh; x 400 g = 4.8 kg. The other team has the series, at 0.
    assert got[("spotbroker_team_energy_kwh_total", (("team", "ml"),))] == pytest.approx(12.0)
    assert got[("spotbroker_team_emissions_kg_co2e_total", (("team", "ml"),))] == pytest.approx(4.8)
    assert got[("spotbroker_team_energy_kwh_total", (("team", "cv"),))] == 0
    assert got[("spotbroker_team_energy_corrections_kwh_total", (("team", "ml"),))] == 0


def test_undelivered_and_refused_notifications_are_exported_per_team(factory, world, clock):
    """A target that refuses (a 500, a redirect) was seen only in the server's log."""
    from spotbroker.broker.store.moneymodels import Alert, Notification

    ml = world.team("ml")
    world.team("cv")  # a team with nothing undelivered: its series say 0
    with transaction(factory) as s:
        alert = Alert(team_id=ml, rule="fast_burn", open_key=f"{ml}:fast_burn", severity="critical", summary="s",
                      advice="a", value=1.0, threshold=1.0, fired_at=T0, history=[])
        s.add(alert)
        s.flush()
        for target, tries, sent in (("ops", 0, None), ("pager", 3, None), ("mail", 1, T0)):
            s.add(Notification(alert_id=alert.id, team_id=ml, target=target, kind="fire", title="t", body="b",
                               tries=tries, next_try_at=T0, sent_at=sent, created_at=T0))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MoneyCollector(factory, clock))
    got = scrape(generate_latest(registry).decode())
    assert got[("spotbroker_notifications_unsent", (("team", "ml"),))] == 2
    assert got[("spotbroker_notifications_failing", (("team", "ml"),))] == 1
    assert got[("spotbroker_notifications_failing", (("team", "cv"),))] == 0
