"""What the policy learns from observations, and the plan it solves from it."""
from __future__ import annotations

import numpy as np
import pytest

from spotbroker.broker.placement.policy import planner
from spotbroker.broker.placement.policy.estimators import estimate, spell_outlook
from spotbroker.broker.placement.policy.model import Event, ZoneHistory


def test_spell_means_are_learned_from_samples():
    rng = np.random.default_rng(3)
    step, up_mean, down_mean = 60.0, 3 * 3600.0, 1800.0
    history = ZoneHistory(join_within_s=1.5 * step)
    t, up = 0.0, True
    while t < 2000 * 3600:
        end = t + rng.exponential(up_mean if up else down_mean)
        while t < end:
            history.record(Event.PROBE_OK if up else Event.PROBE_FAILED, t)
            t += step
        up = not up
    e = estimate(history)
    assert e.up_mean_s == pytest.approx(up_mean, rel=0.15)
    assert e.down_mean_s == pytest.approx(down_mean, rel=0.15)
    assert len(history.up_spells_s) > 100


def test_unwatched_time_is_not_counted():
    history = ZoneHistory(join_within_s=900)
    history.record(Event.PROBE_FAILED, 0)
    history.record(Event.PROBE_FAILED, 600)
    history.record(Event.PROBE_FAILED, 50_000)  # nobody looked in between
    assert history.seconds_down == 600 and history.seconds_up == 0


def test_a_preemption_ends_a_spell_and_a_lifetime():
    history = ZoneHistory(join_within_s=300)
    history.record(Event.CAPACITY_FAILURE, 0)
    history.record(Event.LAUNCH_OK, 200)
    for t in range(400, 2000, 200):
        history.record(Event.RUNNING, t)
    history.record(Event.PREEMPTED, 2000)
    assert history.preemptions == 1 and history.lifetimes_s == [1800]
    assert history.up_spells_s == [1800] and history.ups_lost == 1


def test_spell_outlook_reads_observed_spells_once_there_are_enough():
    blips_and_long = [(120.0, 1.0)] * 10 + [(36000.0, 1.0)] * 10
    young = spell_outlook(blips_and_long, 0.0, 720.0, 100_000.0, up_mean_s=18000.0)
    old = spell_outlook(blips_and_long, 600.0, 720.0, 100_000.0, up_mean_s=18000.0)
    assert young.p_lost == 1.0 and old.p_lost == 1.0  # every spell is shorter than the job
    assert old.productive_s > young.productive_s  # the survivors of a blip are the long ones
    few = spell_outlook([(120.0, 1.0)], 0.0, 720.0, 100_000.0, up_mean_s=18000.0)  # exponential stands in
    assert few.productive_s == pytest.approx(18000 * (np.exp(-720 / 18000) - np.exp(-100720 / 18000)))


def plan(up_s, down_s, work=20, slack=10, unit=600.0):
    inputs = planner.plan_inputs(unit, work * unit, slack * unit, up_s, down_s, 1.0, 3.0, unit)
    return planner.solve(inputs)


def test_plan_with_spot_that_never_fails_runs_spot_once():
    p = plan(up_s=1e12, down_s=600)
    cost = p.value(planner.IDLE_UP, 20 * 600, 10 * 600)
    assert cost == pytest.approx((20 + 1) * 600 / 3600, rel=1e-3)  # one restart, then the work at $1/h


def test_plan_waits_with_slack_and_goes_on_demand_without():
    p = plan(up_s=3600, down_s=1200)
    plenty, none = 10 * 600, 0
    assert p.value(planner.WAIT_DOWN, 5 * 600, plenty) < p.value(planner.LAUNCH_OD_DOWN, 5 * 600, plenty)
    assert p.value(planner.WAIT_DOWN, 5 * 600, none) == np.inf
    # with no slack the rest is on-demand: a restart and the work at $3/h
    assert p.value(planner.IDLE_DOWN, 5 * 600, none) == pytest.approx(6 * 600 * 3 / 3600, rel=0.01)  # prices are
    # rounded to 1 % so that plans are reused


def test_outages_another_zone_covers_count_as_a_bridge_not_a_wait():
    from spotbroker.broker.placement.policy.estimators import ZoneEstimate
    from spotbroker.broker.placement.policy.spotbroker import _outages_covered

    hours = 3600.0
    flaky = ZoneEstimate(up_mean_s=2 * hours, down_mean_s=4 * hours)
    steady = ZoneEstimate(up_mean_s=20 * hours, down_mean_s=0.5 * hours)
    est = [flaky, steady]
    p_down = [e.down_mean_s / (e.up_mean_s + e.down_mean_s) for e in est]
    premium = 2.0 / hours  # $ per second of on-demand instead of spot
    # a bridge there and back costs $2, i.e. one hour of the premium: only that much of a
    # long outage counts, whenever the other zone is up (10/11 of the time)
    seen = _outages_covered(0, est, p_down, p_down[0] * p_down[1], trip=2.0, premium_s=premium)
    assert seen.up_mean_s == flaky.up_mean_s
    assert seen.down_mean_s == pytest.approx(4 * hours / 41 + (40 / 41) * 1 * hours)
    free = _outages_covered(0, est, p_down, p_down[0] * p_down[1], trip=0.0, premium_s=premium)
    assert free.down_mean_s == pytest.approx(4 * hours / 41)  # a zone in the same region: free to bridge
    alone = _outages_covered(0, est[:1], p_down[:1], p_down[0], trip=float("inf"), premium_s=premium)
    assert alone == flaky  # nothing to bridge to
