"""A place's history as of a job's start (`policy/fading.py`): read off
running sums, it equals the samples replayed one by one at their weights
(2^(-age / H) before the job's start, 1 after), as the simulator's memory
replays them."""
from __future__ import annotations

import numpy as np
import pytest

from spotbroker.broker.placement.policy.fading import FadingHistory
from spotbroker.broker.placement.policy.model import Event, ZoneHistory

STEP, H, NOW = 60.0, 6 * 3600.0, 1_800_000_000.0


def samples(seed: int = 7, n: int = 3000) -> list[tuple[float, Event]]:
    """A place sampled every step or two for about four days, up and down in spells."""
    rng = np.random.default_rng(seed)
    out, t, up = [], NOW - 4 * 86400.0, True
    for _ in range(n):
        t += STEP * rng.integers(1, 3)
        if rng.random() < 0.04:
            up = not up
        out.append((t, Event.PROBE_OK if up else (Event.PREEMPTED if rng.random() < 0.5 else Event.PROBE_FAILED)))
    return out


def weighted(events: list[tuple[float, Event]], start_s: float) -> ZoneHistory:
    h = ZoneHistory(join_within_s=1.5 * STEP)
    for at, event in events:
        h.record(event, at, weight=2.0 ** ((at - start_s) / H) if at < start_s else 1.0)
    return h


@pytest.mark.parametrize("days_ago", [5.0, 3.0, 1.5, 0.25, 0.0])
def test_the_history_as_of_a_start_is_the_weighted_replay(days_ago):
    events = samples()
    fading = FadingHistory(1.5 * STEP, H, NOW)
    for at, event in events:
        fading.record(event, at)
    start = NOW - days_ago * 86400
    view, want = fading.as_of(start), weighted(events, start)
    for field in ("seconds_up", "seconds_down", "ups_lost", "downs_ended"):
        assert getattr(view, field) == pytest.approx(getattr(want, field), rel=1e-9, abs=1e-6), field
    assert view.up_spells_s == want.up_spells_s and len(view.up_spells_s) > 10
    assert view.up_spell_weights == pytest.approx(want.up_spell_weights, rel=1e-9)
    assert (view.last_sample_s, view.last_available, view.state_since_s, view.up_start_seen) == \
        (want.last_sample_s, want.last_available, want.state_since_s, want.up_start_seen)
    assert fading.full.ups_lost == weighted(events, events[0][0]).ups_lost  # everything the job's own: unfaded


def test_a_sample_recorded_later_reaches_every_view_and_the_views_are_their_own():
    fading = FadingHistory(1.5 * STEP, H, NOW)
    fading.record(Event.PROBE_OK, NOW - 86400)
    old, new = fading.as_of(NOW - 2 * 86400), fading.as_of(NOW)
    assert fading.as_of(NOW) is new  # one view per start until the next sample
    fading.record(Event.CAPACITY_FAILURE, NOW - 86400 + STEP)
    assert fading.as_of(NOW - 2 * 86400).ups_lost == 1
    assert fading.as_of(NOW).ups_lost == pytest.approx(2 ** -((86400 - STEP) / H))
    assert old.ups_lost == 0 and new.ups_lost == 0  # a view already handed to a decision is not changed
