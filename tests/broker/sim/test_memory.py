"""A memory before the window (`run_arm(..., memory_ticks=N)`, not the protocol's
rule): the zones' histories built from the ticks strictly before a window's start,
as a broker that ran earlier jobs would hold them."""
from __future__ import annotations

import numpy as np
import pytest

from spotbroker.broker.placement.policy import SpotBroker
from spotbroker.broker.placement.policy.egress import region_of
from spotbroker.broker.placement.policy.model import Event
from spotbroker.broker.sim.engine import Job, run_window
from spotbroker.broker.sim.memory import observed_before
from spotbroker.broker.sim.runner import run_arm
from spotbroker.broker.sim.traces import TraceError, TraceSet, ZoneTrace

GAP = 100


def zone(name, unavailable, spot=1.0, od=3.0):
    return ZoneTrace(name, region_of(name), GAP, np.array(unavailable, bool), np.full(len(unavailable), spot), od)


def test_the_memory_reads_only_ticks_before_the_window():
    # ticks 0-9: up 4, down 3, up 3; the window starts at tick 10
    before = [0, 0, 0, 0, 1, 1, 1, 0, 0, 0]
    h, = observed_before(TraceSet((zone("us-east-1c", before + [1] * 40),), GAP), 10, 8)
    # ticks 2..9 sampled at -800 s .. -100 s: up, up, down×3 (one up→down), up×3 (one down→up)
    assert (h.samples, h.ups_lost, h.downs_ended) == (8, 1, 1)
    assert h.seconds_up == pytest.approx(150 + 250) and h.seconds_down == pytest.approx(300)
    assert h.last_sample_s == -GAP and h.last_available is True
    assert h.up_for_s(0.0) == pytest.approx(300)  # its spell began at -300 s
    # whatever the trace holds from the window's first tick on changes nothing
    other, = observed_before(TraceSet((zone("us-east-1c", before + [0] * 40),), GAP), 10, 8)
    assert other == h
    # near the trace's start there is less to remember
    early, = observed_before(TraceSet((zone("us-east-1c", before + [1] * 40),), GAP), 3, 8)
    assert early.samples == 3 and early.last_sample_s == -GAP


def test_a_zone_remembered_as_choppy_is_not_the_home():
    # us-east-1c is the cheaper zone; before the window its spells lasted two ticks
    job = Job(work_s=2000, deadline_s=6000, restart_s=200, checkpoint_gb=10)
    c = zone("us-east-1c", [0, 0, 1, 1] * 15 + [0] * 100, spot=0.9)
    d = zone("us-east-1d", [0] * 160, spot=1.0)
    traces = TraceSet((c, d), GAP)
    blank = run_window(traces.window(60, 100), SpotBroker(), job, keep_timeline=True)
    warm = run_window(traces.window(60, 100), SpotBroker(), job, keep_timeline=True,
                      histories=observed_before(traces, 60, 60))
    assert [o.zone for o in blank.decisions[0].offers][0] == "us-east-1c"
    assert [o.zone for o in warm.decisions[0].offers] == ["us-east-1d"]
    # what the memory said, not what came: 1c is steady in this window, so it costs more
    assert warm.cost > blank.cost


def test_the_memory_is_copied_and_for_the_product_only():
    traces = TraceSet((zone("us-east-1c", [0] * 200),), GAP)
    job = Job(work_s=2000, deadline_s=6000, restart_s=200, checkpoint_gb=10)
    memory = observed_before(traces, 60, 60)
    kept = [h.samples for h in memory]
    run_window(traces.window(60, 140), SpotBroker(), job, histories=memory)
    assert [h.samples for h in memory] == kept
    with pytest.raises(TraceError, match="2 histories for 1 zones"):
        run_window(traces.window(60, 140), SpotBroker(), job, histories=memory * 2)
    for arm in ("skynomad", "up-s", "optimal"):
        with pytest.raises(TraceError, match="spotbroker arm only"):
            run_arm(arm, traces, job, [60], memory_ticks=30)
    (run,) = run_arm("spotbroker", traces, job, [60], memory_ticks=30)
    assert run.result.deadline_met


def test_a_faded_memory_weighs_each_sample_by_its_age_at_the_window_start():
    before = [0, 0, 0, 0, 1, 1, 1, 0, 0, 0]
    traces = TraceSet((zone("us-east-1c", before + [1] * 40),), GAP)
    h, = observed_before(traces, 10, 8, half_life_s=2 * GAP)
    # the up→down change is seen at -600 s (three half-lives old), the down→up one at -300 s
    assert h.ups_lost == pytest.approx(2 ** -3) and h.downs_ended == pytest.approx(2 ** -1.5)
    # each span between two samples weighs as the later sample does
    assert h.seconds_down == pytest.approx(GAP / 2 * 2 ** -3 + GAP * (2 ** -2.5 + 2 ** -2) + GAP / 2 * 2 ** -1.5)
    assert (h.last_sample_s, h.last_available, h.up_for_s(0.0)) == (-GAP, True, pytest.approx(300))
    # the job's own samples weigh 1, however old the memory
    h.record(Event.PROBE_FAILED, 0.0)
    assert h.ups_lost == pytest.approx(2 ** -3 + 1)
    assert h.up_spell_weights == [1.0] and h.up_spells_s == [300.0]


def test_a_zone_remembered_as_choppy_long_ago_is_the_home_again_once_faded():
    job = Job(work_s=2000, deadline_s=6000, restart_s=200, checkpoint_gb=10)
    c = zone("us-east-1c", [0, 0, 1, 1] * 15 + [0] * 100, spot=0.9)
    d = zone("us-east-1d", [0] * 160, spot=1.0)
    traces = TraceSet((c, d), GAP)
    memory = observed_before(traces, 60, 60, half_life_s=GAP)
    faded = run_window(traces.window(60, 100), SpotBroker(), job, keep_timeline=True, histories=memory)
    assert [o.zone for o in faded.decisions[0].offers][0] == "us-east-1c"
