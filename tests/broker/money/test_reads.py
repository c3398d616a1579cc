"""The ledger's read path: every open attempt's unwritten tail read at once
(the prices they need in a fixed number of statements) is what each gives
alone and what accrual then writes; a team's page and the admin's overview
cost the same few statements however many attempts run; and the page's
sums are the costs API's numbers."""
from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

import pytest
from sqlalchemy import event, func, select
from support.world import T0

from spotbroker.broker.money import budgets, costs, dashboard, labels, ledger, overview, views
from spotbroker.broker.money.accrual import Accruer
from spotbroker.broker.money.settings import MoneySettings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Job, Offer
from spotbroker.broker.store.moneymodels import LedgerEntry

H = timedelta(hours=1)
M = timedelta(minutes=1)
SETTINGS = MoneySettings(_env_file=None)


def zone_attempt(factory, job_id: int, start, price: float, zone: str = "us-east-1a") -> int:
    """A spot attempt whose place is a zone name (no zone id), as some launchers report it."""
    with transaction(factory) as s:
        a = Attempt(job_id=job_id, state="RUNNING", launcher="local", cloud="aws", region="us-east-1", zone=zone,
                    zone_id=None, instance_type="g5.xlarge", accelerator="A10G", accelerator_count=1, use_spot=True,
                    num_nodes=1, price_per_hour=price, created_at=start, updated_at=start, started_at=start)
        s.add(a)
        s.flush()
        return a.id


def zone_change(factory, at, price: float, zone: str = "us-east-1a") -> None:
    with transaction(factory) as s:
        s.add(Offer(cloud="aws", region="us-east-1", zone=zone, zone_id="use1-az9", instance_type="g5.xlarge",
                    accelerator="A10G", accelerator_count=1, spot_price=price, ondemand_price=1.0, observed_at=at,
                    source="aws"))


def busy_world(factory, world, clock) -> dict[str, int]:
    """Two teams whose attempts share places and differ in everything the
    prices depend on: spot price changes before launch, while running,
    twice at one instant, after a cursor; a reclaim after a checkpoint; an
    end committed behind a pass; a place named by zone; on-demand prices
    exact, region-wide and unknown."""
    ml, cv = world.team("ml"), world.team("cv")
    world.ondemand(9.0)                                             # use1-az1's own
    world.ondemand(12.0, zone_id="use1-az3")                        # az2 has none: the region's cheapest, 9.0
    world.spot_change(T0 - H, 5.0)                                  # before every launch
    early = world.attempt(world.job(ml, "early"), price=1.0, nodes=2)
    world.attempt(world.job(ml, "later"), start=T0 + 50 * M, price=1.5)
    world.attempt(world.job(cv, "other-az"), start=T0 + 5 * M, price=2.0, zone_id="use1-az2")
    world.attempt(world.job(cv, "no-od"), price=1.1, instance_type="g4dn.xlarge", zone_id="use1-az2")
    world.attempt(world.job(cv, "od"), price=4.0, spot=False, cloud="gcp", region="us-central1", zone_id=None,
                  instance_type="a2-highgpu-1g")
    lost = world.job(ml, "lost")
    reclaimed = world.attempt(lost, start=T0 + 10 * M, price=3.0, zone_id="use1-az2")
    world.checkpoint(lost, reclaimed, T0 + 70 * M)
    late = world.attempt(world.job(ml, "late-end"), price=2.5, spot=False)
    zone_attempt(factory, world.job(cv, "by-zone"), T0 + 3 * M, 0.7)
    zone_change(factory, T0 + 20 * M, 0.9)
    world.spot_change(T0 + 30 * M, 2.0)
    world.spot_change(T0 + 30 * M, 2.2)                             # two samples at one instant: the later id rules
    world.spot_change(T0 + 40 * M, 6.0, zone_id="use1-az2")
    acc = Accruer(factory, SETTINGS, clock=clock)
    clock.advance(minutes=61, seconds=20)
    acc.accrue(clock.now())                                         # written to T0+61 min
    world.end(late, T0 + 55 * M)                                    # its end committed behind that pass
    world.end(reclaimed, T0 + 80 * M, "preempted")
    world.spot_change(T0 + 75 * M, 1.2)                             # after the cursor, before now
    zone_change(factory, T0 + 90 * M, 1.4)
    clock.advance(minutes=40, seconds=7)                            # now: T0+101 min 27 s, between passes
    return {"ml": ml, "cv": cv, "early": early}


def open_attempts(factory) -> list[tuple[Attempt, object]]:
    with factory() as s:
        rows = views.open_attempts(s, None)
        s.expunge_all()
    return [(a, accrued_to) for a, accrued_to, _ in rows]


def test_every_open_attempts_tail_read_at_once_is_what_each_gives_alone_and_what_accrual_writes(
        factory, world, clock):
    busy_world(factory, world, clock)
    now = clock.now()
    opens = open_attempts(factory)
    assert len(opens) == 8
    with factory() as s:
        together = ledger.pending_all(s, opens, now, views.PENDING_STEP_S)
        alone = [ledger.pending(s, a, accrued_to, now, views.PENDING_STEP_S) for a, accrued_to in opens]
        assert together == alone
        written = dict(s.execute(select(LedgerEntry.attempt_id, func.sum(LedgerEntry.amount))
                                 .group_by(LedgerEntry.attempt_id)).all())
        read = views.attempt_costs(s, [a for a, _ in opens], now)
    assert {d.kind for drafts, _, _ in together for d in drafts} == {"usage", "waste", "correction"}
    tails = {a.id: sum(d.amount for d in drafts) for (a, _), (drafts, _, _) in zip(opens, together, strict=True)}
    # What a reader adds now is what the next pass writes: end the running
    # ones now, so that the pass writes every tail whole.
    with transaction(factory) as s:
        for a, _ in opens:
            if a.ended_at is None:
                s.get(Attempt, a.id).ended_at = now
    Accruer(factory, SETTINGS, clock=clock).accrue(now)
    with factory() as s:
        after = dict(s.execute(select(LedgerEntry.attempt_id, func.sum(LedgerEntry.amount))
                               .group_by(LedgerEntry.attempt_id)).all())
    for a, _ in opens:
        assert read[a.id] == pytest.approx(written.get(a.id, 0.0) + tails[a.id]), a.id
        assert read[a.id] == pytest.approx(after[a.id]), a.id


def count_statements(engine) -> list[int]:
    seen = [0]

    def one(conn, cursor, statement, *args) -> None:
        if not statement.startswith("BEGIN"):   # SQLite's transactions are begun by a statement
            seen[0] += 1

    event.listen(engine, "before_cursor_execute", one)
    return seen


def test_the_page_the_overview_and_the_costs_api_read_a_few_statements_however_many_attempts_run(
        engine, factory, world, clock):
    """Before, each running attempt's unwritten tail cost its own statements
    (its place's price in force and changes, its on-demand price): a page or
    the overview of a hundred running attempts was several hundred."""
    ids = busy_world(factory, world, clock)
    seen = count_statements(engine)

    def reads() -> list[int]:
        out = []
        now = clock.now()
        with factory() as s:
            for read in (lambda: dashboard.team_page(s, "ml", now - 30 * H * 24, now, settings=SETTINGS),
                         lambda: overview.teams(s, now - 30 * H * 24, now),
                         lambda: views.team_costs(s, ids["ml"], now - 30 * H * 24, now, "job", now),
                         lambda: views.team_costs(s, ids["ml"], now - 30 * H * 24, now, "label:project", now),
                         lambda: labels.team_chart(s, "ml", "project", now - 30 * H * 24, now)):
                seen[0] = 0
                read()
                out.append(seen[0])
        return out

    with transaction(factory) as s:
        budgets.put(s, ids["ml"], budgets.BudgetIn.model_validate({"amount": 500, "period": "week"}))
    few = reads()
    for i in range(12):                                             # twelve more running, at three places
        world.attempt(world.job(ids["ml"], f"more-{i}", labels={"project": f"p{i % 4}"}), start=T0 + i * M,
                      price=1.0 + i / 10,
                      zone_id=("use1-az1", "use1-az2", "use1-az3")[i % 3])
    assert reads() == few
    # The overview: the tails (4), one scan of the entries, the teams, the budgets, the open alerts.
    assert few == [11, 8, 6, 6, 8]


def test_a_teams_page_sums_are_the_costs_apis_numbers_over_each_range(factory, world, clock):
    """The page draws every chart and window from one grouped read; each
    must equal what the costs API, the budget and the jobs API answer, for
    a range shorter and longer than the budget's period."""
    ids = busy_world(factory, world, clock)
    with transaction(factory) as s:
        budgets.put(s, ids["ml"], budgets.BudgetIn.model_validate({"amount": 50, "period": "month"}))
    clock.advance(days=2)                                            # the running ones' tails span a day's edge
    now = clock.now()
    for days in (1, 3, 40):
        since = now - timedelta(days=days)
        with factory() as s:
            page = dashboard.team_page(s, "ml", since, now, settings=SETTINGS)
            api = {g: views.team_costs(s, ids["ml"], since, now, g, now) for g in (None, "day", "job", "cloud", "gpu")}
            standing = budgets.standing(s, budgets.get(s, ids["ml"]), now)
            windows = {k: views.spend(s, ids["ml"], now - w, now) for k, w in (("1h", H), ("6h", 6 * H))}
            jobs = {j.id: costs.job_costs(s.get(Job, j.id), now) for j in page.jobs}
        t = api[None].total
        assert (page.total.cost, page.total.on_demand_cost, page.total.wasted, page.total.node_hours) == \
            pytest.approx((t.cost, t.on_demand_cost, t.wasted, t.node_hours)), days
        for chart, group in ((page.by_cloud, "cloud"), (page.by_gpu, "gpu")):
            per_day, per_key = defaultdict(float), defaultdict(float)
            for day, parts in chart.items():
                for k, v in parts.items():
                    per_day[day] += v
                    per_key[k] += v
            assert dict(per_day) == pytest.approx({k: m.cost for k, m in api["day"].groups.items()}), days
            assert dict(per_key) == pytest.approx({k: m.cost for k, m in api[group].groups.items()}), days
        top = sorted(api["job"].groups.items(), key=lambda kv: (-kv[1].cost, kv[0]))[:dashboard.TOP_JOBS]
        assert [j.id for j in page.jobs] == [int(k) for k, _ in top]
        assert [j.cost for j in page.jobs] == pytest.approx([m.cost for _, m in top])
        for j in page.jobs:
            assert {a.id: a.cost for a in j.attempts} == pytest.approx(jobs[j.id]), days
        b = page.budget
        assert b.spent == pytest.approx(standing.spent) and b.cumulative[-1][1] == pytest.approx(standing.spent)
        assert b.rate_6h == pytest.approx(windows["6h"] / 6)
        assert b.burn["1h"] == pytest.approx(windows["1h"] / (b.amount / budgets.period_of("month", now).hours))


def test_a_range_that_ended_before_an_attempts_tail_builds_nothing_for_it(factory, world, clock):
    """A report until a past date took every running attempt's tail, which starts
    after that date, for a correction of everything since, cut minute by minute:
    `until=2000-01-01` built 14 million entries and took the broker to 17 GB."""
    team = world.team()
    world.attempt(world.job(team), price=2.0)
    clock.advance(days=30)
    Accruer(factory, MoneySettings(_env_file=None), clock=clock).accrue(clock.now())
    clock.advance(minutes=3)  # a tail not yet written, after the range below
    with factory() as s:
        assert views.unwritten(s, team, T0 + timedelta(days=1)) == []
        report = views.team_costs(s, team, T0, T0 + timedelta(days=1), "job", clock.now())
        assert report.total.cost == pytest.approx(48.0)  # the day's entries, as written
        assert views.every_team(s, T0 - timedelta(days=60), T0 - timedelta(days=30), clock.now())[team].cost == 0
        tails = views.unwritten(s, team, clock.now())  # to now: the unwritten minutes
        assert tails and sum(d.amount for t in tails for d in t.drafts) == pytest.approx(2.0 * 3 / 60, rel=0.4)
