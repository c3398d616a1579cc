"""The product's policy: it never looks ahead (nor does any other online arm),
never misses a deadline even without the simulator's safety net, and waits for
spot when there is none."""
from __future__ import annotations

import numpy as np
import pytest

from spotbroker.broker.placement.policy.egress import region_of
from spotbroker.broker.placement.policy.model import (
    Action,
    Capacity,
    Event,
    Observation,
    Running,
    ZoneHistory,
    ZoneState,
)
from spotbroker.broker.placement.policy.spotbroker import SpotBroker
from spotbroker.broker.sim.engine import Job, run_window
from spotbroker.broker.sim.runner import policy_factory
from spotbroker.broker.sim.traces import TraceSet, ZoneTrace


@pytest.mark.parametrize("policy", ["spotbroker", "skynomad", "up-s", "greedy"])
def test_decisions_up_to_t_ignore_everything_after_t(v100, job, policy):
    """Every online arm: a run on a trace whose future after tick t is replaced makes
    the same decisions up to t."""
    make = policy_factory(policy)
    window = v100.window(5530, v100.n_ticks - 5530)
    rng = np.random.default_rng(7)
    # a different future: shuffled availability, other prices
    other = TraceSet(tuple(ZoneTrace(z.zone, z.region, z.gap_s, rng.permutation(z.unavailable),
                                     z.spot_price[::-1].copy(), z.on_demand_price) for z in window.zones),
                     window.gap_s)
    base = run_window(window, make(), job, keep_timeline=True)
    for t in (40, 300):
        changed = run_window(window.replace_after(t, other), make(), job, keep_timeline=True)
        assert changed.timeline[: t + 1] == base.timeline[: t + 1]
        assert changed.decisions[: t + 1] == base.decisions[: t + 1]
    assert changed.timeline != base.timeline  # the future did change something


def random_traces(rng, n_zones, n_ticks, gap):
    zones = []
    for i in range(n_zones):
        up, down = rng.uniform(2, 60), rng.uniform(1, 60)  # mean spell lengths in ticks
        state, data = rng.random() < 0.5, []
        while len(data) < n_ticks:
            length = int(rng.exponential(up if state else down)) + 1
            data += [not state] * length
            state = not state
        prices = rng.uniform(0.3, 1.5) * (1 + 0.1 * rng.standard_normal(n_ticks)).clip(0.5)
        name = f"{['us-east-1', 'us-west-2', 'eu-west-1'][i % 3]}{'abc'[i // 3]}"
        zones.append(ZoneTrace(name, region_of(name), gap, np.array(data[:n_ticks]), prices,
                               float(rng.uniform(2.0, 4.0))))
    return TraceSet(tuple(zones), gap)


@pytest.mark.parametrize("seed", range(12))
def test_never_misses_a_deadline_on_its_own(seed):
    """No simulator safety net here: the policy's own guard must do it."""
    rng = np.random.default_rng(seed)
    gap = int(rng.choice([60, 195, 600]))
    work_ticks = int(rng.integers(20, 120))
    job = Job(work_s=work_ticks * gap, deadline_s=int(work_ticks * rng.uniform(1.1, 2.0)) * gap + 720,
              restart_s=720, checkpoint_gb=float(rng.choice([0, 50, 200])))
    traces = random_traces(rng, int(rng.integers(1, 6)), job.window_ticks(gap) + 2, gap)
    result = run_window(traces, SpotBroker(), job, safety_net=False)
    assert result.deadline_met, (seed, result)


def zone_state(name, price, available):
    history = ZoneHistory()
    history.record(Event.PROBE_OK if available else Event.PROBE_FAILED, 0.0)
    return ZoneState(name, region_of(name), price, 3.0, history)


def observation(zones, deadline_s, running=None):
    return Observation(now_s=0.0, step_s=600.0, work_left_s=36000.0, work_total_s=36000.0, started_s=0.0,
                       deadline_s=deadline_s, restart_overhead_s=720.0, checkpoint_gb=50.0, zones=tuple(zones),
                       running=running, last_zone=None)


def test_without_a_deadline_it_only_ever_waits_for_spot():
    zones = [zone_state("us-east-1a", 1.2, True), zone_state("us-west-2a", 0.9, False)]
    decision = SpotBroker().decide(observation(zones, deadline_s=None))
    assert decision.action is Action.LAUNCH and decision.otherwise is Action.WAIT
    assert all(o.capacity is Capacity.SPOT for o in decision.offers)
    # the cheaper one was just seen without spot (at t = 0, which the policy once took for "never")
    assert [o.zone for o in decision.offers] == ["us-east-1a", "us-west-2a"]
    zones = [zone_state("us-east-1a", 1.2, True), zone_state("us-west-2a", 0.9, True)]
    decision = SpotBroker().decide(observation(zones, deadline_s=None))
    assert decision.offers[0].zone == "us-west-2a"  # the cheaper one first


def test_with_no_slack_left_it_goes_on_demand():
    zones = [zone_state("us-east-1a", 1.2, True), zone_state("us-west-2a", 0.9, True)]
    decision = SpotBroker().decide(observation(zones, deadline_s=36000.0 + 720.0))
    assert decision.action is Action.LAUNCH
    assert [o.capacity for o in decision.offers] == [Capacity.ON_DEMAND]


def test_twenty_zones():
    names = [f"{r}{z}" for r in ("us-east-1", "us-east-2", "us-west-2", "eu-west-1", "ap-south-1") for z in "abcd"]
    zones = [zone_state(n, 0.5 + i / 40, i % 3 == 0) for i, n in enumerate(names)]
    decision = SpotBroker().decide(observation(zones, deadline_s=54000.0))
    assert decision.action is Action.LAUNCH and decision.offers


def watched(name, price, spells, step=600.0):
    """A zone watched every step through `spells`: (available?, seconds) in order."""
    history, t = ZoneHistory(join_within_s=1.5 * step), 0.0
    for up, length in spells:
        for _ in range(int(length // step)):
            history.record(Event.PROBE_OK if up else Event.PROBE_FAILED, t)
            t += step
    return ZoneState(name, region_of(name), price, 3.06, history)


def test_a_bridge_instance_is_ridden_not_judged_by_outages_it_will_not_wait_out():
    """Running spot in a zone with long outages while the home is out: keeping it until
    it is reclaimed and then going home is worth more than paying egress to a third
    zone, however bad that zone would be as a home."""
    hours = 3600.0
    home = watched("us-east-2b", 0.92, [(True, 20 * hours), (False, 1200.0)])
    bridge = watched("us-west-2a", 0.92, [(True, 2 * hours), (False, 12 * hours), (True, 1200.0)])
    third = zone_state("us-east-1c", 1.2, True)
    obs = Observation(now_s=16 * hours, step_s=600.0, work_left_s=30 * hours, work_total_s=40 * hours,
                      started_s=0.0, deadline_s=60 * hours, restart_overhead_s=720.0, checkpoint_gb=50.0,
                      zones=(third, home, bridge), running=Running("us-west-2a", Capacity.SPOT, 0.0, 15.9 * hours),
                      last_zone="us-west-2a")
    assert SpotBroker().decide(obs).action is Action.KEEP


@pytest.mark.parametrize("origin", [0.0, 3600.0])
def test_leaving_on_demand_reads_a_spell_seen_at_time_zero(origin):
    """On on-demand, the home's spell seen starting at t = 0 (a clock that starts with the
    job) is a fresh sample like any other: the decision does not depend on the origin
    of the caller's clock (t = 0 was once taken for "never sampled")."""
    history = ZoneHistory(join_within_s=900.0)
    history.record(Event.PROBE_FAILED, origin)
    history.record(Event.PROBE_OK, origin)  # the spell starts at the clock's origin
    home = ZoneState("us-east-2b", region_of("us-east-2b"), 0.9, 3.06, history)
    obs = Observation(now_s=origin + 300.0, step_s=600.0, work_left_s=30 * 3600.0, work_total_s=40 * 3600.0,
                      started_s=origin - 10 * 3600.0, deadline_s=origin + 50 * 3600.0, restart_overhead_s=720.0,
                      checkpoint_gb=50.0, zones=(home,), running=Running("us-east-2b", Capacity.ON_DEMAND, 0.0, origin),
                      last_zone="us-east-2b")
    decision = SpotBroker().decide(obs)
    assert "probing home" not in decision.reason
