"""Burn-rate alerts on an injected clock: both windows of a pair must burn
over the threshold; forecast, spend thresholds, committed rate and the hard
cap; each opened once, resolved when it clears, silenced on request; and
the hard cap's stop_running keeps checkpoints."""
from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select
from support.world import KEYRING, T0

from spotbroker.broker.money import alerts, budgets, hardcap
from spotbroker.broker.money.accrual import Accruer
from spotbroker.broker.money.settings import MoneySettings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Checkpoint, Job
from spotbroker.broker.store.moneymodels import Alert, AlertSilence, Notification

HOOK = {"name": "ops", "kind": "webhook", "url": "http://127.0.0.1:9/hook"}


def set_budget(factory, clock, team, **kw):
    body = budgets.BudgetIn.model_validate({"amount": 24.0, "period": "day", "targets": [HOOK], **kw})
    with transaction(factory) as s:
        budgets.put(s, team, body, clock, KEYRING)


def evaluate(factory, clock):
    Accruer(factory, MoneySettings(_env_file=None), clock=clock).accrue(clock.now())
    with transaction(factory) as s:
        return alerts.evaluate(s, clock.now())


def open_rules(factory) -> set[str]:
    with factory() as s:
        return set(s.scalars(select(Alert.rule).where(Alert.open_key.is_not(None))))


def test_a_fast_burn_fires_once_with_its_neighbours_and_everything_resolves(factory, world, clock):
    team = world.team()
    set_budget(factory, clock, team)                         # $24 a day: $1/h even
    job = world.job(team)
    a = world.attempt(job, price=20.0, spot=False)          # 20x
    clock.advance(minutes=4)
    evaluate(factory, clock)
    assert "fast_burn" not in open_rules(factory)           # the 5 min window is hot, the hour is not yet
    clock.advance(minutes=56)
    assert evaluate(factory, clock)[0] >= 1
    rules = open_rules(factory)
    assert {"fast_burn", "spend_80", "forecast"} <= rules   # one spend alert, at its highest threshold
    assert not rules & {"slow_burn", "hard_cap", "spend_50", "spend_100", "committed"}  # the forecast says it
    assert evaluate(factory, clock) == (0, 0)               # deduplicated
    world.end(a, clock.now())
    clock.advance(minutes=10)
    evaluate(factory, clock)
    assert "fast_burn" in open_rules(factory)               # 5 min window cold, but not for 15 min yet
    clock.advance(minutes=15)
    evaluate(factory, clock)
    assert "fast_burn" not in open_rules(factory)           # clear for 15 min: resolved
    clock.advance(days=1)
    evaluate(factory, clock)
    assert open_rules(factory) == set()                     # a new day, a new budget
    with factory() as s:
        sent = s.execute(select(Notification.kind, Alert.rule).join(Alert, Alert.id == Notification.alert_id)).all()
        fast = s.scalar(select(Alert).where(Alert.rule == "fast_burn"))
    assert sorted(k for k, r in sent if r == "fast_burn") == ["fire", "resolve"]
    assert "20.0x" in fast.summary and "`spotbroker budget set ml AMOUNT --period day`" in fast.advice
    assert [e["kind"] for e in fast.history] == ["fire", "resolve"]


def test_one_spend_alert_per_period_escalates_50_80_100(factory, world, clock):
    """$0.01 of a budget crossed at once opened spend_50, spend_80 and
    spend_100 together, each reading the same percentage: now one alert
    climbs, each step sent once, and 100 % is said by the hard cap."""
    team = world.team()
    set_budget(factory, clock, team, rules={"fast_burn": False, "slow_burn": False, "forecast": False,
                                            "committed_hours": 0.001})    # $24 a day
    world.attempt(world.job(team), price=12.0, spot=False)   # 50 % at 1 h, 80 % at 1 h 36, 100 % at 2 h
    kinds = []
    for minutes in (61, 36, 25):
        clock.advance(minutes=minutes)
        evaluate(factory, clock)
        with factory() as s:
            spend = s.scalars(select(Alert).where(Alert.rule.like("spend_%"))).all()
            kinds.append((len(spend), spend[0].rule, spend[0].open_key is not None))
    assert kinds == [(1, "spend_50", True), (1, "spend_80", True), (1, "spend_100", True)]
    with factory() as s:
        alert = s.scalar(select(Alert).where(Alert.rule == "spend_100"))
        sent = s.execute(select(Notification.kind, Alert.rule).join(Alert, Alert.id == Notification.alert_id)
                         .order_by(Notification.id)).all()
    assert [(e["kind"], e["rule"]) for e in alert.history] == [
        ("fire", "spend_50"), ("escalate", "spend_80"), ("escalate", "spend_100")]
    assert "threshold 50%" in alert.history[0]["summary"]
    assert sent == [("fire", "spend_100"), ("escalate_80", "spend_100"), ("fire", "hard_cap")]
    with factory() as s:
        bodies = s.scalars(select(Notification.body).order_by(Notification.id)).all()
    assert "threshold 80%" in bodies[1] and "`spotbroker costs --team ml --group-by job`" in bodies[1]
    assert "`spotbroker budget set ml AMOUNT --period day` (admin) raises the budget" in bodies[2]  # was {team}
    clock.advance(days=1)                                     # a new period: the spend alert resolves at once
    world_end_all(factory, clock)
    evaluate(factory, clock)
    assert open_rules(factory) == set()


def world_end_all(factory, clock):
    with transaction(factory) as s:
        for a in s.scalars(select(Attempt).where(Attempt.ended_at.is_(None))):
            a.ended_at, a.end_reason, a.state = clock.now() - timedelta(days=1), "succeeded", "SUCCEEDED"


def test_the_forecast_reads_the_running_rate_not_a_diluted_average(factory, world, clock):
    """A job started 10 minutes ago at $3.20/h on a $20-a-day budget ends
    the day far over it; the 6 hours' average said $0.09/h and nothing."""
    team = world.team()
    set_budget(factory, clock, team, amount=20.0, rules={"fast_burn": False, "slow_burn": False,
                                                         "thresholds": []})
    world.attempt(world.job(team), price=1.6, nodes=2, spot=False, start=T0 - timedelta(minutes=10))
    evaluate(factory, clock)
    with factory() as s:
        alert = s.scalar(select(Alert).where(Alert.rule == "forecast"))
    # T0 is 12:00: $0.53 spent, 12 h left at $3.20/h.
    assert alert is not None and "$3.20/h" in alert.summary and "ends at $38.93 of $20.00" in alert.summary
    assert "runs out about 2026-03-02 18:05 UTC" in alert.summary


def test_a_crossing_is_seen_by_the_first_evaluation_after_it_whatever_accrual_wrote(factory, world, clock):
    """Accrual writes whole minutes only; the alerts add each open attempt's
    unwritten rest, so the windows count to now: a crossing between passes
    (or with no accrual at all) fires at the next evaluation."""
    team = world.team()
    set_budget(factory, clock, team, rules={"fast_burn": True, "slow_burn": False, "forecast": False,
                                            "thresholds": [], "committed_hours": 0.001})  # $1/h even
    # Runs from T0 + 30 min 10 s at a price whose hour crosses 14.4x after 29 min 24 s of it.
    world.attempt(world.job(team), price=14.4 * 60 / 29.4, spot=False, start=T0 + timedelta(minutes=30, seconds=10))
    acc = Accruer(factory, MoneySettings(_env_file=None), clock=clock)
    for _ in range(59):
        clock.advance(minutes=1)
        acc.accrue(clock.now())          # written to T0 + 59 min (whole minutes; the first one short)
    with transaction(factory) as s:
        assert alerts.evaluate(s, clock.now()) == (0, 0)     # 28 min 50 s of it: not yet
    clock.advance(seconds=30)            # 29 min 20 s: not yet
    with transaction(factory) as s:
        assert alerts.evaluate(s, clock.now()) == (0, 0)
    clock.advance(seconds=20)            # 29 min 40 s: crossed, and no accrual since
    with transaction(factory) as s:
        assert alerts.evaluate(s, clock.now())[0] == 1
    assert open_rules(factory) == {"fast_burn"}


def test_the_slow_pair_needs_both_windows_and_a_silence_keeps_it_quiet(factory, world, clock):
    team = world.team()
    set_budget(factory, clock, team, amount=240.0, rules={"thresholds": [], "forecast": False})  # $10/h even
    job = world.job(team)
    with transaction(factory) as s:
        s.add(AlertSilence(team_id=team, rule="slow_burn", until=T0 + timedelta(days=1), created_at=T0))
    world.attempt(job, price=70.0, spot=False)              # 7x: slow, not fast
    for _ in range(12):
        clock.advance(minutes=30)
        evaluate(factory, clock)
    assert open_rules(factory) >= {"slow_burn"} and "fast_burn" not in open_rules(factory)
    with factory() as s:
        assert s.scalars(select(Notification.id).join(Alert, Alert.id == Notification.alert_id)
                         .where(Alert.rule == "slow_burn")).all() == []


def test_over_budget_holds_new_jobs_and_stop_running_keeps_checkpoints(factory, world, clock):
    team = world.team()
    set_budget(factory, clock, team, amount=5.0, hard_cap_action="stop_running", recoveries="hold")
    job = world.job(team)
    a = world.attempt(job, price=10.0, spot=False)
    world.checkpoint(job, a, T0 + timedelta(minutes=20))
    clock.advance(minutes=40)
    evaluate(factory, clock)
    assert "hard_cap" in open_rules(factory)
    with factory() as s:
        reason = budgets.hold_reason(s, team, False, clock.now())
        assert reason.startswith("over budget: $6.67 spent of $5.00")
        assert budgets.hold_reason(s, team, True, clock.now()) is not None   # recoveries: hold
    assert hardcap.stop_running(factory, clock) == 1
    with factory() as s:
        assert s.get(Job, job).state == "HELD" and "over budget" in s.get(Job, job).reason
        assert s.get(Attempt, a).state == "CANCELLED"
        assert s.scalar(select(Checkpoint.step).where(Checkpoint.job_id == job)) == 1
    set_budget(factory, clock, team, amount=500.0)
    with factory() as s:
        assert budgets.hold_reason(s, team, True, clock.now()) is None


def test_a_job_the_cap_stopped_stays_held_while_over_even_where_recoveries_are_allowed(factory, world, clock):
    """`recoveries: allow` (the default) lets a job the cloud reclaimed resume
    over budget; a job the cap itself stopped was taken for such a recovery,
    released a minute later and stopped again: a new paid launch a minute."""
    team = world.team()
    set_budget(factory, clock, team, amount=5.0, hard_cap_action="stop_running")
    job = world.job(team)
    world.attempt(job, price=10.0, spot=False)
    clock.advance(minutes=40)
    assert hardcap.stop_running(factory, clock) == 1
    with factory() as s:
        assert hardcap.budget_hold(s, s.get(Job, job), clock).startswith("over budget")
    set_budget(factory, clock, team, amount=500.0)  # raised: it goes back
    with factory() as s:
        assert hardcap.budget_hold(s, s.get(Job, job), clock) is None


SPEND_ONLY = {"fast_burn": False, "slow_burn": False, "forecast": False, "committed_hours": 0.001}


def spend_sent(factory) -> list[tuple[str, str]]:
    with factory() as s:
        return [(k, t.split(": ")[-1]) for k, t in s.execute(
            select(Notification.kind, Notification.title).join(Alert, Alert.id == Notification.alert_id)
            .where(Alert.rule.like("spend_%")).order_by(Notification.id))]


def test_a_budget_changed_mid_period_tells_each_threshold_of_the_new_amount_once(factory, world, clock):
    """A spend alert's threshold was compared in the old budget's dollars: a
    raise told a lower step as "(escalated)", then a second `escalate_80`
    broke the unique key and stopped every team's alert pass."""
    team = world.team()
    set_budget(factory, clock, team, amount=24.0, rules=SPEND_ONLY)
    world.attempt(world.job(team), price=12.0, spot=False)
    clock.advance(minutes=100)                                      # $20 of $24: 83 %
    evaluate(factory, clock)
    set_budget(factory, clock, team, amount=30.0, rules=SPEND_ONLY)  # 67 %: the 80 % of $24 is not of $30
    evaluate(factory, clock)
    clock.advance(minutes=25)                                       # $25 of $30: 83 %
    evaluate(factory, clock)
    evaluate(factory, clock)
    assert spend_sent(factory) == [("fire", "spend 80"), ("resolve", "spend"), ("fire", "spend 50"),
                                   ("escalate_80", "spend 80% (escalated)")]
    # The resolve says the budget changed, with the figures of now (it said "83% ... of $24.00" alone).
    with factory() as s:
        body = s.scalar(select(Notification.body).where(Notification.kind == "resolve"))
    assert "the day's budget is now $30.00, with $20.00 spent (67%). It said: 83% of the day's budget" in body, body


def test_one_teams_failing_alerts_leave_the_others_theirs(factory, world, clock):
    """A budget stored with two targets of one name (before the API refused it)
    failed every pass on the notifications' unique key, and no team was alerted."""
    from sqlalchemy import update

    from spotbroker.broker.store.moneymodels import Budget

    broken, fine = world.team("broken"), world.team("fine")
    for team in (broken, fine):
        set_budget(factory, clock, team, amount=24.0, rules=SPEND_ONLY, targets=[HOOK, {**HOOK, "name": "two"}])
        world.attempt(world.job(team), price=12.0, spot=False)
    with transaction(factory) as s:
        targets = s.get(Budget, broken).targets
        s.execute(update(Budget).where(Budget.team_id == broken).values(targets=[targets[0], targets[0]]))
    clock.advance(minutes=70)
    evaluate(factory, clock)
    with factory() as s:
        alerted = set(s.scalars(select(Alert.team_id).where(Alert.open_key.is_not(None))))
    assert alerted == {fine}
    with pytest.raises(ValueError, match=r"targets.1.name: 'ops' is given twice"):
        budgets.BudgetIn.model_validate({"amount": 1, "targets": [HOOK, HOOK]})


@pytest.mark.parametrize("ends, recovery", [
    (["preempted"], True), (["vanished", "no_capacity", "launch_error"], True), (["moved"], True),
    (["failed"], False),       # a restart after a failed exit (max_restarts): launched over budget before
    (["succeeded"], False),    # the GPU launch after a passed pre-flight: an 8-GPU run launched over budget
    (["preempted", "failed"], False), (["cancelled"], False)])
def test_only_a_run_the_cloud_took_back_or_the_broker_moved_recovers_over_budget(factory, world, clock, ends,
                                                                                 recovery):
    team = world.team()
    set_budget(factory, clock, team, amount=5.0)  # hold_new, recoveries: allow
    job = world.job(team)
    for reason in ends:
        world.attempt(job, price=10.0, spot=False, end=clock.now() + timedelta(minutes=40), end_reason=reason)
    clock.advance(minutes=41)
    with factory() as s:
        held = hardcap.budget_hold(s, s.get(Job, job), clock)
    assert (held is None) == recovery, held


def test_a_realistic_day_sends_one_notification_per_real_condition(factory, world, clock):
    """A $100 day, evaluated every 2 minutes on the injected clock: job A runs
    01:00-09:00 at $8/h and is preempted at 05:00 (its recovery starts at
    05:04), job B runs 08:00-18:00 at $6/h; the budget is crossed once, at
    14:00. Three real conditions: the running rate ends the day over
    budget (from 01:00), the spend's level (50 %, then 80 %), the cap. Each
    is opened once and no notification is sent twice; the old rules opened
    three spend alerts and resolved and refired the rate's in the gap."""
    day = T0.replace(hour=0)
    clock.t = day
    team = world.team()
    set_budget(factory, clock, team, amount=100.0)
    a_job, b_job = world.job(team, "a"), world.job(team, "b")
    plan = {day.replace(hour=1): lambda: world.attempt(a_job, price=8.0, spot=True, start=clock.now()),
            day.replace(hour=5): lambda: world.end(attempts["a"], clock.now(), "preempted"),
            day.replace(hour=5, minute=4): lambda: world.attempt(a_job, price=8.0, spot=True, start=clock.now()),
            day.replace(hour=8): lambda: world.attempt(b_job, price=6.0, spot=True, start=clock.now()),
            day.replace(hour=9): lambda: world.end(attempts["a"], clock.now()),
            day.replace(hour=18): lambda: world.end(attempts["b"], clock.now())}
    attempts = {}
    acc = Accruer(factory, MoneySettings(_env_file=None), clock=clock)
    while clock.now() < day + timedelta(days=1, hours=1):
        step = plan.get(clock.now())
        if step:
            made = step()
            if made:
                attempts["b" if clock.now().hour == 8 else "a"] = made
        acc.accrue(clock.now())
        with transaction(factory) as s:
            alerts.evaluate(s, clock.now())
        clock.advance(minutes=2)
    with factory() as s:
        opened = s.scalars(select(Alert).order_by(Alert.id)).all()
        sent = s.execute(select(Notification.kind, Notification.alert_id, Notification.created_at)
                         .order_by(Notification.id)).all()
    fires = [(a.rule, a.fired_at.hour) for a in opened]
    assert fires == [("forecast", 1), ("spend_100", 7), ("hard_cap", 14)]  # the spend alert climbed to 100
    assert len(sent) == len({(k, a) for k, a, _ in sent})                   # nothing sent twice
    assert [(k, next(a.rule for a in opened if a.id == i)) for k, i, _ in sent] == [
        ("fire", "forecast"), ("fire", "spend_100"), ("escalate_80", "spend_100"), ("fire", "hard_cap"),
        ("resolve", "forecast"), ("resolve", "spend_100"), ("resolve", "hard_cap")]
    assert all(a.resolved_at is not None for a in opened)                  # the next day starts clean


def test_spend_alerts_opened_apart_before_the_upgrade_become_one(factory, world, clock):
    team = world.team()
    set_budget(factory, clock, team, rules={"fast_burn": False, "slow_burn": False, "forecast": False,
                                            "committed_hours": 0.001})
    with transaction(factory) as s:
        for t in (50, 80):
            s.add(Alert(team_id=team, rule=f"spend_{t}", open_key=f"{team}:spend_{t}", severity="warning",
                        summary="old", advice="old", value=1.0, threshold=t / 100 * 24, fired_at=T0))
    world.attempt(world.job(team), price=12.0, spot=False)
    clock.advance(minutes=100)                                  # 83 %
    evaluate(factory, clock)
    assert open_rules(factory) == {"spend_80"}
    assert evaluate(factory, clock) == (0, 0)


def test_a_fast_burns_time_left_is_at_the_present_pace(factory, world, clock):
    """The hour's dollars were read as a rate: a job ten minutes old at $100/h on a
    $24 day was told "0.4 h more" when its $7.33 left lasted 4 minutes."""
    team = world.team()
    set_budget(factory, clock, team)
    clock.advance(hours=2)
    world.attempt(world.job(team), price=100.0, spot=False, start=clock.now())
    clock.advance(minutes=10)
    evaluate(factory, clock)
    with factory() as s:
        fast = s.scalar(select(Alert).where(Alert.rule == "fast_burn"))
    assert fast is not None and "lasts 4 min more at the last 5 minutes' pace ($100.00/h)" in fast.summary, \
        fast.summary if fast else open_rules(factory)
