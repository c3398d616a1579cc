"""A place's history as each job reads it: what was seen before the job
started fades by its age then, what was seen since counts in full.

Every job reads the same samples of a place, but jobs start at different
times. Replaying the samples once per job (`ZoneHistory.record(...,
weight)`, as the simulator's memory does) costs a replay per job and pass;
`FadingHistory` replays them once, keeping after each sample the running
sums of its increments (time seen up and down, spells lost and ended)
twice: as seen, and scaled by 2^((t - origin) / H). The history of a job
started at T0 is then a bisection: the scaled sums before T0 times
2^((origin - T0) / H), plus the plain sums from T0 on; every increment gets
2^(-(T0 - t) / H), what `record` with that weight would give it.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import replace

from spotbroker.broker.placement.policy.model import Event, ZoneHistory

_COUNTS = ("seconds_up", "seconds_down", "ups_lost", "downs_ended")


class FadingHistory:
    """One place's samples, in time order; `as_of(T0)` is the history a job
    started at T0 decides from. `full` is the history unfaded."""

    def __init__(self, join_within_s: float, half_life_s: float, origin_s: float) -> None:
        # origin: a time near the samples (the pass's now), so that 2^((t - origin) / H) stays in range
        self.full = ZoneHistory(join_within_s=join_within_s)
        self.half_life_s, self.origin_s = half_life_s, origin_s
        self.times: list[float] = []
        self.plain: list[tuple[float, ...]] = [(0.0,) * len(_COUNTS)]  # sums before sample i, at i
        self.scaled: list[tuple[float, ...]] = [(0.0,) * len(_COUNTS)]
        self.spells: list[tuple[float, float]] = []  # (length, when it ended)
        self._views: dict[float, ZoneHistory] = {}

    def record(self, event: Event, at_s: float, seen_since_last: bool = False) -> None:
        """`ZoneHistory.record` of a sample no earlier than the last one."""
        h = self.full
        spells = len(h.up_spells_s)
        h.record(event, at_s, seen_since_last)
        now = (h.seconds_up, h.seconds_down, h.ups_lost, h.downs_ended)  # the plain sums are the history's own
        (up, down, lost, ended), (su, sd, sl, se) = self.plain[-1], self.scaled[-1]
        scale = 2.0 ** ((at_s - self.origin_s) / self.half_life_s)
        self.times.append(at_s)
        self.plain.append(now)
        self.scaled.append((su + scale * (now[0] - up), sd + scale * (now[1] - down), sl + scale * (now[2] - lost),
                            se + scale * (now[3] - ended)))
        if len(h.up_spells_s) > spells:
            self.spells.append((h.up_spells_s[-1], at_s))
        self._views.clear()

    def as_of(self, start_s: float) -> ZoneHistory:
        """The history a job started at `start_s` reads (the same object until the next `record`)."""
        view = self._views.get(start_s)
        if view is None:
            i = bisect_left(self.times, start_s)  # samples [0, i) were seen before the job
            k = 2.0 ** ((self.origin_s - start_s) / self.half_life_s)
            counts = {c: k * self.scaled[i][n] + self.plain[-1][n] - self.plain[i][n] for n, c in enumerate(_COUNTS)}
            weights = [2.0 ** ((end - start_s) / self.half_life_s) if end < start_s else 1.0 for _, end in self.spells]
            view = self._views[start_s] = replace(
                self.full, **counts, up_spells_s=[length for length, _ in self.spells], up_spell_weights=weights,
                lifetimes_s=list(self.full.lifetimes_s))
        return view
