"""The §2 clock, billing and egress rules on tiny hand-checked traces."""
from __future__ import annotations

import numpy as np
import pytest

from spotbroker.broker.placement.policy.egress import region_of
from spotbroker.broker.placement.policy.model import Capacity
from spotbroker.broker.sim.baselines import Greedy
from spotbroker.broker.sim.engine import Job, run_window
from spotbroker.broker.sim.traces import TraceSet, ZoneTrace


def zone(name, unavailable, spot=3.6, od=36.0, gap=100):
    n = len(unavailable)
    return ZoneTrace(name, region_of(name), gap, np.array(unavailable, bool), np.full(n, spot), od)


def test_restart_overhead_credit_and_the_unbilled_last_interval():
    # 3.6 $/h = $0.1 per 100 s tick. d = 250 s: ticks 0, 1 give nothing, tick 2 gives 50 s.
    traces = TraceSet((zone("a-1a", [0] * 40),), 100)
    job = Job(work_s=1000, deadline_s=3000, restart_s=250, checkpoint_gb=10)
    r = run_window(traces, Greedy(), job, keep_timeline=True)
    # progress 50 after tick 2, +100 per tick: 1000 reached in interval 12, finished at t = 13
    assert r.finish_s == 1300
    assert r.cost == pytest.approx(12 * 0.1)  # intervals 0..11; the completing one is not billed
    assert [s.progress_s for s in r.timeline[:5]] == [0, 0, 0, 50, 150]


def test_preemption_relaunch_elsewhere_pays_egress_once():
    a = zone("us-east-1c", [0] * 5 + [1] * 35, spot=1.8)
    b = zone("us-west-2a", [0] * 40, spot=3.6)
    job = Job(work_s=1000, deadline_s=3900, restart_s=250, checkpoint_gb=10)
    r = run_window(TraceSet((a, b), 100), Greedy(), job, keep_timeline=True)
    assert r.preemptions == 1 and r.launches == 2
    assert r.egress == pytest.approx(10 * 0.02)
    assert r.timeline[5].preempted and r.timeline[5].zone == 1
    # a: 5 ticks at $0.05 (250 s progress); b: 250 s overhead again, then 750 s more work
    # (50 s in tick 7, then 100 s a tick) → b runs ticks 5..14, the last (14) unbilled
    assert r.finish_s == 1500
    assert r.cost == pytest.approx(5 * 0.05 + 9 * 0.1 + 0.2)


def test_safety_net_latches_to_on_demand_in_time():
    traces = TraceSet((zone("a-1a", [1] * 40),), 100)  # spot never there
    job = Job(work_s=1000, deadline_s=2000, restart_s=250, checkpoint_gb=10)
    r = run_window(traces, Greedy(), job, keep_timeline=True)
    assert r.deadline_met and r.finish_s <= 2000
    latched = [s for s in r.timeline if s.latched]
    assert latched and latched[0].capacity is Capacity.ON_DEMAND
    # need = ceil((1000+250)/100)*100 = 1300 >= floor((2000-100t)/100)*100 first at t = 7
    assert latched[0].tick == 7
