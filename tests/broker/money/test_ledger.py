"""The ledger: an attempt's cost is its price over its running time × nodes,
at the spot price in force at each moment; entries are only ever appended;
waste, savings and corrections; every total agrees."""
from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select
from support.world import T0

from spotbroker.broker.money import costs, views
from spotbroker.broker.money.accrual import Accruer
from spotbroker.broker.money.settings import MoneySettings
from spotbroker.broker.store.models import Job
from spotbroker.broker.store.moneymodels import LedgerEntry

H = timedelta(hours=1)


def accruer(factory, clock, owner="a") -> Accruer:
    return Accruer(factory, MoneySettings(_env_file=None), clock=clock, owner=owner)


def entries(factory) -> list[tuple]:
    with factory() as s:
        return [tuple(r) for r in s.execute(select(
            LedgerEntry.id, LedgerEntry.kind, LedgerEntry.start_at, LedgerEntry.end_at, LedgerEntry.amount,
            LedgerEntry.ondemand_amount, LedgerEntry.wasted).order_by(LedgerEntry.id))]


def job_cost(factory, job_id, now) -> float:
    with factory() as s:
        return sum(costs.job_costs(s.get(Job, job_id), now).values())


def team_total(factory, team_id, now, group_by=None):
    with factory() as s:
        return views.team_costs(s, team_id, T0 - 30 * H, now + H, group_by, now)


def test_on_demand_cost_is_price_times_nodes_times_hours_appended_minute_by_minute(factory, world, clock):
    team = world.team()
    job = world.job(team)
    world.attempt(job, price=3.0, nodes=2, spot=False)
    acc = accruer(factory, clock)
    seen = []
    for _ in range(90):  # one pass a minute for an hour and a half
        clock.advance(minutes=1)
        acc.accrue(clock.now())
        now_rows = entries(factory)
        assert now_rows[:len(seen)] == seen  # nothing written before ever changes
        seen = now_rows
    assert len(seen) == 90 and all(kind == "usage" for _, kind, *_ in seen)
    assert sum(r[4] for r in seen) == pytest.approx(9.0)       # $3 x 2 nodes x 1.5 h
    assert job_cost(factory, job, clock.now()) == pytest.approx(9.0)
    report = team_total(factory, team, clock.now())
    assert report.total.cost == pytest.approx(9.0) and report.total.savings == pytest.approx(0.0)
    # Between passes a reader sees to now: 30 s more of $6/h.
    clock.advance(seconds=30)
    assert job_cost(factory, job, clock.now()) == pytest.approx(9.05)
    assert team_total(factory, team, clock.now()).total.cost == pytest.approx(9.05)


def test_spot_cost_follows_the_price_in_force_after_launch(factory, world, clock):
    team = world.team()
    job = world.job(team)
    world.spot_change(T0 - H, 5.0)                    # before launch: the launch price rules
    world.attempt(job, price=1.0, nodes=2)
    world.spot_change(T0 + timedelta(minutes=30), 2.0)
    world.spot_change(T0 + timedelta(minutes=45), 4.0)
    world.spot_change(T0 + timedelta(minutes=30), 2.0, zone_id="use1-az2")   # another place: not ours
    acc = accruer(factory, clock)
    clock.advance(minutes=20)
    acc.accrue(clock.now())
    clock.advance(minutes=40)
    acc.accrue(clock.now())
    # 30 min at $1, 15 at $2, 15 at $4, on 2 nodes
    expected = 2 * (0.5 * 1 + 0.25 * 2 + 0.25 * 4)
    assert job_cost(factory, job, clock.now()) == pytest.approx(expected)
    assert sum(r[4] for r in entries(factory)) == pytest.approx(expected)
    # a row a minute, the one cut at each change too: at 30 and 45 minutes exactly, nothing more
    assert len(entries(factory)) == 60


def test_waste_is_the_run_since_the_last_checkpoint_at_a_preemption(factory, world, clock):
    team = world.team()
    job = world.job(team)
    a1 = world.attempt(job, price=2.0)
    world.checkpoint(job, a1, T0 + timedelta(minutes=40))
    world.end(a1, T0 + H, "preempted")
    a2 = world.attempt(job, price=2.0, start=T0 + 2 * H)
    world.end(a2, T0 + 3 * H, "succeeded")                 # no waste for a normal end
    clock.advance(hours=4)
    # Node-hours are the hours run (the lost 20 minutes were run once, in usage: counted
    # twice before), read from the tails before a pass and from the entries after.
    unwritten = team_total(factory, team, clock.now(), "job")
    assert unwritten.total.node_hours == pytest.approx(2.0) and unwritten.total.wasted == pytest.approx(2.0 / 3)
    assert unwritten.groups[str(job)].node_hours == pytest.approx(2.0)
    accruer(factory, clock).accrue(clock.now())
    wastes = [r for r in entries(factory) if r[1] == "waste"]
    assert len(wastes) == 1 and wastes[0][6] == pytest.approx(2.0 * 20 / 60) and wastes[0][4] == 0
    report = team_total(factory, team, clock.now())
    assert report.total.wasted == pytest.approx(2.0 / 3) and report.total.cost == pytest.approx(4.0)
    assert report.total.node_hours == pytest.approx(2.0)
    assert team_total(factory, team, clock.now(), "job").groups[str(job)].node_hours == pytest.approx(2.0)
    # Closed attempts are never read again: another pass writes nothing.
    before = entries(factory)
    clock.advance(hours=1)
    accruer(factory, clock).accrue(clock.now())
    assert entries(factory) == before


def test_savings_are_the_on_demand_price_of_the_same_hours_less_what_was_paid(factory, world, clock):
    team = world.team()
    world.ondemand(4.0)
    world.attempt(world.job(team), price=1.0)
    clock.advance(hours=2)
    accruer(factory, clock).accrue(clock.now())
    total = team_total(factory, team, clock.now()).total
    assert total.cost == pytest.approx(2.0) and total.on_demand_cost == pytest.approx(8.0)
    assert total.savings == pytest.approx(6.0)


def test_an_end_committed_behind_a_pass_is_corrected_by_a_new_entry(factory, world, clock):
    team = world.team()
    job = world.job(team)
    a = world.attempt(job, price=6.0)
    clock.advance(hours=1)
    accruer(factory, clock).accrue(clock.now())           # accrued as running to T0+1h
    world.end(a, T0 + timedelta(minutes=50))               # it had ended at 50 min
    before = entries(factory)
    clock.advance(minutes=1)
    accruer(factory, clock).accrue(clock.now())
    after = entries(factory)
    assert after[:len(before)] == before
    fixes = after[len(before):]
    assert {f[1] for f in fixes} == {"correction"} and sum(f[4] for f in fixes) == pytest.approx(-1.0)
    assert job_cost(factory, job, clock.now()) == pytest.approx(5.0)


def test_one_accruer_at_a_time_and_no_minute_written_twice(factory, world, clock):
    team = world.team()
    world.attempt(world.job(team), price=60.0)
    one, two = accruer(factory, clock, "one"), accruer(factory, clock, "two")
    clock.advance(minutes=1)
    assert one.pass_once() is not None
    assert two.pass_once() is None                         # ran a moment ago: not due
    one.accrue(clock.now())                                # the same `now` again writes nothing
    assert len(entries(factory)) == 1
    clock.advance(minutes=1)
    assert two.pass_once() is not None                     # due again: whoever comes first
    assert len(entries(factory)) == 2
    assert sum(r[4] for r in entries(factory)) == pytest.approx(2.0)


def test_team_view_groups_agree_with_the_total(factory, world, clock):
    team, other = world.team("ml"), world.team("other")
    j1, j2 = world.job(team, "a"), world.job(team, "b")
    world.attempt(j1, price=1.0)
    world.attempt(j2, price=2.0, spot=False, cloud="gcp", region="us-central1", zone_id=None,
                  instance_type="a2-highgpu-1g", accelerator="A100")
    world.attempt(world.job(other), price=100.0)
    acc = accruer(factory, clock)
    for _ in range(26):  # across a day boundary (T0 is noon)
        clock.advance(hours=1)
        acc.accrue(clock.now())
    total = team_total(factory, team, clock.now()).total.cost
    assert total == pytest.approx(26 * 3.0)
    for group_by in views.GROUPS:
        report = team_total(factory, team, clock.now(), group_by)
        assert sum(g.cost for g in report.groups.values()) == pytest.approx(total), group_by
    assert set(team_total(factory, team, clock.now(), "day").groups) == {"2026-03-02", "2026-03-03"}
    assert set(team_total(factory, team, clock.now(), "cloud").groups) == {"aws", "gcp"}
    jobs = team_total(factory, team, clock.now(), "job")
    assert sorted(jobs.names.values()) == ["a", "b"]
    with factory() as s:
        assert s.scalar(select(func.count()).select_from(LedgerEntry)) == 3 * 26 * 60  # one a minute each


def test_unwritten_cost_falls_in_the_windows_it_was_spent_in(factory, world, clock):
    """Before accrual catches up (a broker that was down), what readers add
    for the unwritten time is spread over that time, as accrual will write it:
    the last hour's spend of a three-hour run is one hour's, not three."""
    team = world.team()
    job = world.job(team)
    world.attempt(job, price=3.0, spot=False)
    clock.advance(hours=3)
    with factory() as s:
        last_hour = views.spend(s, team, clock.now() - H, clock.now())
        days = views.team_costs(s, team, T0 - 30 * H, clock.now() + H, "day", clock.now())
    assert last_hour == pytest.approx(3.0)
    assert days.total.cost == pytest.approx(9.0)


def test_a_running_attempt_gets_one_row_a_minute_however_the_passes_fall(factory, world, clock):
    """Passes land off the minute's edge (every 61.3 s here, as a loop that
    wakes late does); accrual writes whole minutes only and readers add the
    rest, so a day of running is 1,440 rows and every total stays exact."""
    team = world.team()
    job = world.job(team)
    world.attempt(job, price=6.0, spot=False, start=T0 + timedelta(seconds=17))
    acc = accruer(factory, clock)
    day = T0 + timedelta(days=1, seconds=17)
    while clock.now() < day:
        clock.advance(seconds=61.3)
        acc.accrue(clock.now())
        if clock.now().second % 7 == 0:   # now and then, a reader between passes sees to now
            hours = (clock.now() - T0 - timedelta(seconds=17)).total_seconds() / 3600
            assert job_cost(factory, job, clock.now()) == pytest.approx(6.0 * hours)
            assert team_total(factory, team, clock.now()).total.cost == pytest.approx(6.0 * hours)
    with factory() as s:
        rows = s.scalar(select(func.count()).select_from(LedgerEntry))
        written_to = s.scalar(select(func.max(LedgerEntry.end_at)))
    assert written_to.second == 0 and written_to <= clock.now()        # whole minutes only
    assert rows == (written_to - T0).total_seconds() // 60             # one row a minute, the first short
    assert 1440 <= rows <= 1442                                        # a day (and the last pass's minute)
    hours = (clock.now() - T0 - timedelta(seconds=17)).total_seconds() / 3600
    with factory() as s:
        days = views.team_costs(s, team, T0 - H, clock.now() + H, "day", clock.now())
        hour = views.spend(s, team, clock.now() - H, clock.now())
    assert days.total.cost == pytest.approx(6.0 * hours)
    assert abs(hour - 6.0) <= 0.1     # an entry counts where it starts: a window is exact to one minute
    assert sum(g.cost for g in days.groups.values()) == pytest.approx(6.0 * hours)


def test_every_teams_totals_in_one_read_agree_with_each_teams_view(factory, world, clock):
    """The admin's overview reads every team at once: the same totals as each
    team's own view, the unwritten tail of running attempts included."""
    ml, other, idle = world.team("ml"), world.team("other"), world.team("idle")
    world.attempt(world.job(ml), price=1.0)
    world.attempt(world.job(ml), price=2.0, start=T0 - 3 * H, end=T0 - H, end_reason="preempted")
    world.attempt(world.job(other), price=5.0, spot=False)
    acc = accruer(factory, clock)
    for _ in range(3):
        clock.advance(minutes=47, seconds=13)
        acc.accrue(clock.now())
    clock.advance(seconds=31)                                  # between passes
    now = clock.now()
    with factory() as s:
        every = views.every_team(s, T0 - 30 * H, now + H, now)
        for team in (ml, other, idle):
            one = views.team_costs(s, team, T0 - 30 * H, now + H, None, now).total
            mine = every.get(team, views.Money())
            assert (mine.cost, mine.on_demand_cost, mine.wasted, mine.node_hours) == pytest.approx(
                (one.cost, one.on_demand_cost, one.wasted, one.node_hours)), team
    assert every[other].cost == pytest.approx(5.0 * (now - T0).total_seconds() / 3600)


def test_jobs_are_grouped_in_the_order_of_their_ids(factory, world, clock):
    """Grouped by job, "10" came before "2" (the keys sorted as text), in the API and the CSV."""
    team = world.team()
    for _ in range(11):
        world.attempt(world.job(team), price=1.0)
    clock.advance(hours=1)
    keys = list(team_total(factory, team, clock.now(), "job").groups)
    assert keys == sorted(keys, key=int) and len(keys) == 11, keys
