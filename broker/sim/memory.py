"""What a broker would already know of the zones when a window starts.

The protocol starts every window blank: the policy knows nothing of any zone
but its prior. A broker in production is not blank: it runs jobs one after
another and replays every zone's samples of the last days from its database
(`broker/placement/histories.py`), so a new job's first decision already sees
the spells and outages earlier jobs observed. This module builds that memory
for a simulated window from the trace's ticks strictly *before* the window's
first tick (never one at or after it): each zone as if it had been probed at
every tick of the `ticks` before the window, the samples timed before the
window's clock origin (negative seconds).
"""
from __future__ import annotations

from spotbroker.broker.placement.policy.model import Event, ZoneHistory
from spotbroker.broker.sim.traces import TraceSet


def observed_before(traces: TraceSet, start_tick: int, ticks: int,
                    half_life_s: float | None = None) -> list[ZoneHistory]:
    """One history per zone: every tick in [start_tick - ticks, start_tick) sampled
    (fewer where the trace begins later); the window's clock is 0 at `start_tick`.
    `half_life_s`: each sample weighs 2^(-age / half_life_s), its age taken at
    the window's start (the job's own samples, after it, weigh 1)."""
    gap = traces.gap_s
    first = max(0, start_tick - ticks)
    histories = []
    for zone in traces.zones:
        h = ZoneHistory(join_within_s=1.5 * gap)
        for k in range(first, start_tick):
            at = float((k - start_tick) * gap)
            weight = 1.0 if half_life_s is None else 2.0 ** (at / half_life_s)
            h.record(Event.PROBE_FAILED if zone.unavailable[k] else Event.PROBE_OK, at, weight=weight)
        histories.append(h)
    return histories
