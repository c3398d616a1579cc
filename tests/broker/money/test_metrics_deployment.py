"""/metrics across replicas: the deployment's totals come from one broker at
a time (the holder of the metrics lease), cost is a counter that only grows,
every team has every series (0 included), and each broker adds its own
process and HTTP metrics. The reconciler's lag and the price sources'
freshness are read from the database."""
from __future__ import annotations

import math
import re
from contextlib import ExitStack
from datetime import timedelta

import pytest
from conftest import ADMIN_TOKEN, served
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select
from support.money import scrape, seed
from support.world import T0

from spotbroker.broker.jobs.resources import CLOUDS
from spotbroker.broker.jobs.states import JobState
from spotbroker.broker.metrics.collector import LedgerTotals, MoneyCollector
from spotbroker.broker.money.accrual import Accruer
from spotbroker.broker.money.settings import MoneySettings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Job, PriceSourceLease, Team

H = timedelta(hours=1)
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def collect(*collectors: MoneyCollector) -> list[dict]:
    out = []
    for c in collectors:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(c)
        out.append(scrape(generate_latest(registry).decode()))
    return out


def team_series(sample: dict) -> set[str]:
    return {name for name, labels in sample if dict(labels).get("team")}


def test_cost_is_a_counter_that_outlives_the_month(factory, world, clock):
    seed(factory, world, clock)
    (got,) = collect(MoneyCollector(factory, clock))
    ml, cv = (("team", "ml"),), (("team", "cv"),)
    assert got[("spotbroker_team_cost_dollars_total", ml)] == pytest.approx(12.0)   # 2 h x 2 nodes x $3
    assert got[("spotbroker_team_cost_dollars_total", cv)] == pytest.approx(1.0)
    assert got[("spotbroker_team_ondemand_cost_dollars_total", ml)] >= 0
    assert got[("spotbroker_team_cost_corrections_dollars_total", ml)] == 0
    # into the next month: the month's gauge starts again, the counter does not
    clock.advance(days=40)
    Accruer(factory, MoneySettings(_env_file=None), clock=clock).accrue(clock.now())
    (later,) = collect(MoneyCollector(factory, clock))
    assert later[("spotbroker_team_cost_dollars_total", ml)] > got[("spotbroker_team_cost_dollars_total", ml)]
    assert later[("spotbroker_team_cost_dollars_total", cv)] == pytest.approx(1.0)
    assert later[("spotbroker_team_cost_month_dollars", cv)] == 0


def test_the_counters_read_only_new_entries_and_miss_none(factory, world, clock):
    """The holder folds settled entries into running sums: what it says after
    many scrapes is what a fresh read of the whole ledger says."""
    seed(factory, world, clock)
    held = MoneyCollector(factory, clock)
    ml = ("spotbroker_team_cost_dollars_total", (("team", "ml"),))
    (first,) = collect(held)
    assert held.ledger.upto == 0   # every entry was just written: none settled yet
    for minutes in (11, 3, 30, 90):
        clock.advance(minutes=minutes)
        Accruer(factory, MoneySettings(_env_file=None), clock=clock).accrue(clock.now())
        (now,) = collect(held)
        with factory() as session:
            whole = LedgerTotals().read(session, clock.now() - timedelta(days=1))   # nothing folded: all read
        assert now[ml] == pytest.approx(whole[world_team(factory, "ml")][0])
        assert now[ml] >= first[ml]
        first = now
    assert held.ledger.upto > 0   # older entries were folded, and are not read again
    held.release()
    (fresh,) = collect(MoneyCollector(factory, clock))
    assert fresh[ml] == pytest.approx(first[ml])


def world_team(factory, name: str) -> int:
    with factory() as session:
        return session.scalar(select(Team.id).where(Team.name == name))


def test_a_team_with_nothing_yet_has_every_series_at_zero(factory, world, clock):
    world.team("idle")
    (got,) = collect(MoneyCollector(factory, clock))
    idle = ("team", "idle")
    for state in JobState:
        assert got[("spotbroker_jobs", (("state", str(state)), idle))] == 0
    for cloud in CLOUDS:
        assert got[("spotbroker_preemptions_total", (("cloud", cloud), idle))] == 0
        for market in ("spot", "on_demand"):
            assert got[("spotbroker_placement_decisions_total", (("cloud", cloud), ("market", market), idle))] == 0
    for name in ("spotbroker_team_cost_dollars_total", "spotbroker_team_wasted_dollars_total",
                 "spotbroker_recoveries_total", "spotbroker_checkpoint_flush_seconds_count",
                 "spotbroker_jobs_waiting_for_placement", "spotbroker_team_cost_month_dollars"):
        assert got[(name, (idle,))] == 0, name
    assert got[("spotbroker_checkpoint_flush_seconds_bucket", (("le", "+Inf"), idle))] == 0


def test_one_replica_exports_the_totals_until_it_lets_go(factory, world, clock):
    seed(factory, world, clock)
    first, second = MoneyCollector(factory, clock, hold_s=60), MoneyCollector(factory, clock, hold_s=60)
    a, b = collect(first, second)
    assert a[("spotbroker_metrics_exporter", ())] == 1 and b[("spotbroker_metrics_exporter", ())] == 0
    assert "spotbroker_team_cost_dollars_total" in team_series(a) and not team_series(b)
    assert "spotbroker_reconciler_lag_seconds" not in {name for name, _ in b}
    # the holder keeps it by being scraped; the other takes over once it has not been for `hold_s`
    clock.advance(seconds=50)
    a, b = collect(first, second)
    assert a[("spotbroker_metrics_exporter", ())] == 1 and not team_series(b)
    clock.advance(seconds=61)
    b, a = collect(second, first)
    assert b[("spotbroker_metrics_exporter", ())] == 1 and team_series(b) and not team_series(a)
    second.release()  # a broker shutting down gives it to the next scrape of another at once
    (a,) = collect(first)
    assert a[("spotbroker_metrics_exporter", ())] == 1


def test_reconciler_lag_and_price_freshness(factory, world, clock, monkeypatch):
    monkeypatch.setenv("SPOTBROKER_PRICES_SOURCES", "catalog,azure")
    team = world.team("ml")
    due, held, later = world.job(team, "due", "PENDING"), world.job(team, "held", "PENDING"), world.job(team)
    with transaction(factory) as s:
        s.get(Job, due).next_check_at = T0 - timedelta(seconds=30)
        s.get(Job, held).next_check_at = T0 - timedelta(seconds=300)   # a broker works on it now
        s.get(Job, held).lease_owner, s.get(Job, held).lease_expires_at = "other", T0 + timedelta(seconds=10)
        s.get(Job, later).next_check_at = T0 + timedelta(seconds=30)
        s.add(PriceSourceLease(source="catalog", last_ok_at=T0 - timedelta(seconds=100)))
        s.add(PriceSourceLease(source="aws", last_ok_at=T0 - H, last_error="AccessDenied"))
    collector = MoneyCollector(factory, clock)
    (got,) = collect(collector)
    assert got[("spotbroker_reconciler_lag_seconds", ())] == pytest.approx(30)
    assert got[("spotbroker_price_source_age_seconds", (("source", "catalog"),))] == pytest.approx(100)
    assert got[("spotbroker_price_source_last_success_timestamp_seconds", (("source", "catalog"),))] == \
        pytest.approx((T0 - timedelta(seconds=100)).timestamp())
    assert got[("spotbroker_price_source_failing", (("source", "aws"),))] == 1
    assert got[("spotbroker_price_source_failing", (("source", "catalog"),))] == 0
    # configured, never refreshed: still a series
    assert math.isinf(got[("spotbroker_price_source_age_seconds", (("source", "azure"),))])
    assert got[("spotbroker_price_source_last_success_timestamp_seconds", (("source", "azure"),))] == 0
    with transaction(factory) as s:
        s.get(Job, due).next_check_at = None
    (got,) = collect(collector)
    assert got[("spotbroker_reconciler_lag_seconds", ())] == 0


def families(text: str) -> dict[str, tuple[str, list[str]]]:
    return {f.name: (f.type, [s.name for s in f.samples]) for f in text_string_to_metric_families(text)}


def test_two_brokers_on_one_database_count_each_dollar_once(settings):
    """Two real servers sharing one database, scraped as Prometheus scrapes
    every pod: sum() over them is the deployment's figure."""
    stacks = [ExitStack(), ExitStack()]
    try:
        clients = [stacks[0].enter_context(served(settings)), stacks[1].enter_context(served(settings.model_copy()))]
        made = clients[0].post("/v1/teams", json={"name": "ml"}, headers=ADMIN)
        assert made.status_code == 201
        team = {"Authorization": f"Bearer {made.json()['token']}"}
        assert clients[0].get("/v1/jobs/987654", headers=team).status_code == 404
        brew = clients[0].request("PROPFIND", "/v1/jobs", headers=team)   # a WebDAV method: no series of its own
        assert brew.status_code == 405, brew.status_code
        texts = [c.get("/metrics", headers=ADMIN).text for c in clients]
        samples = [scrape(t) for t in texts]
        assert sum(s[("spotbroker_metrics_exporter", ())] for s in samples) == 1
        exporting = [i for i, s in enumerate(samples) if team_series(s)]
        assert len(exporting) == 1
        holder = exporting[0]
        assert samples[holder][("spotbroker_team_cost_dollars_total", (("team", "ml"),))] == 0
        for text, sample in zip(texts, samples, strict=True):
            assert sample[("process_resident_memory_bytes", ())] > 0   # each broker's own process
            for name, (kind, names) in families(text).items():   # Prometheus' conventions: counters _total
                assert name.startswith(("spotbroker_", "process_", "python_")), name
                if kind == "counter":
                    assert all(n.endswith(("_total", "_created")) for n in names), name
                assert not re.search(r"_(rate|percent|ms|minutes|hours)$", name), name
        answered = samples[0][("spotbroker_http_requests_total", (
            ("method", "GET"), ("route", "/v1/jobs/{job_id}"), ("status", "404")))]
        assert answered == 1   # by route template, never the raw path
        assert not [labels for name, labels in samples[0] if name == "spotbroker_http_requests_total"
                    and dict(labels)["method"] not in ("GET", "POST", "other")]
        assert any(dict(labels)["method"] == "other" for name, labels in samples[0]
                   if name == "spotbroker_http_requests_total")
        # the holder shuts down: the other exports at its next scrape
        stacks[holder].close()
        assert team_series(scrape(clients[1 - holder].get("/metrics", headers=ADMIN).text))
    finally:
        for stack in stacks:
            stack.close()


def test_a_database_out_of_reach_is_said_and_the_scrape_still_answers(clock, tmp_path):
    """The database cut from one broker made its /metrics a 500: the
    process's own metrics went with the deployment's totals."""
    from spotbroker.broker.store.db import make_engine, make_session_factory

    nowhere = make_engine(f"sqlite:///{tmp_path / 'missing' / 'broker.db'}")  # a directory that is not there
    (got,) = collect(MoneyCollector(make_session_factory(nowhere), clock))
    assert got == {("spotbroker_database_up", ()): 0}
    nowhere.dispose()
