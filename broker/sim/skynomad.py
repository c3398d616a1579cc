"""SkyNomad (spot-sim-protocol §5, the Fig 9b arm), written from the protocol's text.

Each tick it values every option as a rate in $/h against V, what an hour of
progress is worth now:

    V = max(c_od * T * (P - p) / ((T - t) * P), min_r spot_r)

(c_od the cheapest on-demand price, T the deadline, P the work, p the
progress, t the time elapsed). Spot in zone r is worth V over the expected
remaining lifetime E_r of a spot run there, less the restart overhead, the
spot price and the egress fee spread over E_r; on-demand is worth V less its
price (and, away from the checkpoint, the overhead's worth and the fee). The
best option that beats the current one (by a margin δ when it means leaving
a running instance) is launched; every 6 ticks the other zones are probed.

E_r comes from the runs seen in zone r (our spot runs and the spells our
probes opened), by a Nelson-Aalen hazard with a geometric tail, sharpened by
a burst multiplier g >= 1 when failures lately came faster than the hazard
predicts. All of it is learned from what the policy observes (its launch and
probe results and preemptions, read from the zones' histories); nothing reads
the trace.

Where §5 leaves a detail open, the choice made here is named in a comment
starting "Chosen:" (and listed in docs/simulator.md).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from spotbroker.broker.placement.policy.model import (
    Action,
    Capacity,
    Decision,
    Observation,
    Offer,
)

MAX_PREDICTION_H = 1e9  # --max-prediction-hours 1e9
PROBE_EVERY_TICKS = 6
PROBE_AGE_S = 60.0  # a successful probe vouches for at least a minute of spot
NO_TAIL_RATE = 1e-8
BURST_WINDOW_RISK = 8.0  # keep the newest burst entries whose risk adds up to about this
BURST_SUFFIX_RISK = 1.0


@dataclass
class _Run:
    """One spell of spot capacity seen in a zone: our spot instance, or one a probe opened."""

    start_s: float  # times in seconds on the observation's clock (exact sums of ticks)
    floor_s: float  # a probe run is at least a minute old (§5 "a run's age is at least ...")
    end_s: float | None = None
    failed: bool = False
    accounted_h: float = 0.0  # the age up to which the burst multiplier has counted its risk

    def age(self, now_s: float) -> float:
        """In hours."""
        return max((self.end_s if self.end_s is not None else now_s) - self.start_s, self.floor_s) / 3600


@dataclass
class _Hazard:
    """A Nelson-Aalen cumulative hazard: steps h_j at the distinct failure ages τ_j."""

    knots: list[float]
    steps: list[float]
    tail: float

    @staticmethod
    def fit(samples: list[tuple[float, bool]]) -> _Hazard:
        """samples: (age in h, ended in a failure?); censored runs count only as at risk."""
        failures: dict[float, int] = {}
        for age, failed in samples:
            if failed:
                failures[age] = failures.get(age, 0) + 1
        knots = sorted(failures)
        ages = sorted(age for age, _ in samples)
        steps = []
        for tau in knots:
            at_risk = len(ages) - _bisect_left(ages, tau)
            steps.append(failures[tau] / at_risk)
        return _Hazard(knots, steps, steps[-1] if steps else NO_TAIL_RATE)

    def cumulative(self, a: float) -> float:
        """H0(a): the steps below a, plus the tail rate times the time since the last knot passed."""
        total, last = 0.0, 0.0
        for tau, h in zip(self.knots, self.steps):
            if tau >= a:
                break
            total += h
            last = tau
        return total + self.tail * (a - last)

    def expected_life(self, a: float, g: float, gap_h: float) -> float:
        """E(a): expected further life of a run aged a, hazard steps scaled by g."""
        e, survival, prev = 0.0, 1.0, a
        for tau, h in zip(self.knots, self.steps):
            if tau <= a:
                continue
            e += survival * (tau - prev)
            survival *= math.exp(-g * h)
            prev = tau
        return e + survival * gap_h / -math.expm1(-g * self.tail)


def _bisect_left(xs: list[float], x: float) -> int:
    lo, hi = 0, len(xs)
    while lo < hi:
        mid = (lo + hi) // 2
        if xs[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@dataclass
class _Zone:
    up: bool = False  # virtual availability (ignored while our spot instance runs here)
    probed_ok: bool = False  # a probe succeeded here and no launch has succeeded here since
    done: list[_Run] = field(default_factory=list)
    open: _Run | None = None
    failures_logged: int = 0  # since the last burst update
    ended: list[_Run] = field(default_factory=list)  # runs closed since the last burst update
    counts: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)  # the history's counters last seen

    def hazard(self, now_s: float) -> _Hazard:
        samples = [(r.age(now_s), r.failed) for r in self.done]
        if self.open is not None:
            samples.append((self.open.age(now_s), False))
        return _Hazard.fit(samples)


@dataclass
class _Pending:
    """What the last decision asked for, to read its results from the histories."""

    at_s: float
    offers: tuple[Offer, ...]
    probe: tuple[str, ...]
    running: tuple[str, Capacity] | None


@dataclass
class SkyNomad:
    """SkyNomad's rate-ratio cost model with virtual availability (§5). One per job."""

    name: str = "skynomad"
    _zones: dict[str, _Zone] = field(default_factory=dict)
    _burst: deque = field(default_factory=deque)  # (risk, failures), oldest first
    _g: float = 1.0
    _pending: _Pending | None = None
    _next_probe: int = 0

    def decide(self, obs: Observation) -> Decision:
        """One decision, in the published algorithm's order (observe, burst
        multiplier, value per zone, then launch, probe or wait). Kept whole (about
        100 lines) so it reads against the paper step by step; the numbered
        comments are its steps."""
        assert obs.deadline_s is not None, "SkyNomad needs a deadline"
        now_s = obs.now_s - obs.started_s
        now_h = now_s / 3600
        gap_h = obs.step_s / 3600
        d_h = obs.restart_overhead_s / 3600
        tick = round((obs.now_s - obs.started_s) / obs.step_s)
        for z in obs.zones:
            self._zones.setdefault(z.zone, _Zone())

        # 1. what happened since the last decision, then the burst multiplier
        self._observe(obs, now_s)
        self._update_burst(now_s, gap_h)

        # 2. value the options
        T_h = (obs.deadline_s - obs.started_s) / 3600
        P, p = obs.work_total_s, obs.work_total_s - obs.work_left_s
        c_od = min(z.on_demand_price for z in obs.zones)
        V = max(c_od * T_h * (P - p) / ((T_h - now_h) * P), min(z.spot_price for z in obs.zones))
        running = obs.running
        origin = running.zone if running is not None else obs.last_zone
        gb = obs.checkpoint_gb
        cap_h = min(MAX_PREDICTION_H, T_h - now_h)

        def fee(zone: str) -> float:
            return obs.egress.fee(origin, zone, gb)

        if running is None:
            current = 0.0
        else:
            price = next(z for z in obs.zones if z.zone == running.zone)
            # Chosen: E > 0 always holds here (the tail term is positive), so a
            # running spot instance is worth V - spot.
            current = V - (price.spot_price if running.capacity is Capacity.SPOT else price.on_demand_price)
        delta = 0.5 + 0.0002 * gb + 0.05 * V

        spot_options: list[tuple[float, Offer]] = []
        od_options: list[tuple[float, Offer]] = []
        for z in obs.zones:
            state = self._zones[z.zone]
            age = state.open.age(now_s) if state.open is not None else 0.0
            e = min(state.hazard(now_s).expected_life(age, self._g, gap_h), cap_h)
            here_spot = running is not None and running.zone == z.zone and running.capacity is Capacity.SPOT
            if e - (0.0 if here_spot else d_h) <= 0:
                value = -math.inf
            else:
                value = (V * (e - (0.0 if here_spot else d_h)) - z.spot_price * e) / e - fee(z.zone) / e
            spot_options.append((value, Offer(z.zone, Capacity.SPOT)))
            # Chosen: with no origin yet (nothing has run), every zone counts as "away".
            away = origin is None or z.zone != origin
            od_options.append((V - z.on_demand_price - (d_h * V + fee(z.zone) if away else 0.0),
                               Offer(z.zone, Capacity.ON_DEMAND)))

        options: list[tuple[float, Offer | None]] = [(0.0, None)]  # IDLE first among equals
        for value, offer in spot_options + od_options:
            if value < 0:
                continue
            if running is not None:
                if offer.zone == running.zone and offer.capacity is running.capacity:
                    continue  # the option identical to what runs
                leaving = offer.capacity is Capacity.ON_DEMAND or offer.zone != running.zone
                if leaving and value <= current + delta:
                    continue
            options.append((value, offer))
        options.sort(key=lambda o: -o[0])  # stable: IDLE, SPOT r0.., OD r0.. among equals

        # 3. the options worth more than what runs now, in order, up to IDLE (which keeps it)
        offers: list[Offer] = []
        for value, offer in options:
            if value <= current or offer is None:
                break
            offers.append(offer)
            if offer.capacity is Capacity.ON_DEMAND:
                break  # on-demand always launches

        # 4. probe every other zone every 6 ticks
        probe: list[str] = []
        if tick >= self._next_probe:
            self._next_probe = tick + PROBE_EVERY_TICKS
            # Chosen: the interface carries out launches and probes in one go, so the probe
            # list cannot depend on which offer succeeds. A spot offer's zone is listed: the
            # simulator skips it when the launch there succeeded, and a probe where the launch
            # just failed fails too, for nothing. An on-demand offer's zone is left out (it
            # is the chosen zone whenever that offer is reached), as is the current zone.
            # Chosen: "until a launch happens there" means a launch that got capacity; a
            # zone whose probe succeeded is not probed again after a failed launch there.
            skip = {o.zone for o in offers if o.capacity is Capacity.ON_DEMAND}
            if running is not None:
                skip.add(running.zone)
            probe = [z.zone for z in obs.zones if z.zone not in skip and not self._zones[z.zone].probed_ok]

        self._pending = _Pending(now_s, tuple(offers), tuple(probe),
                                 None if running is None else (running.zone, running.capacity))
        reason = f"skynomad: V={V:.2f} g={self._g:.2f}"
        if offers:
            return Decision.launch(*offers, otherwise=Action.KEEP, reason=reason, probe=tuple(probe))
        return Decision.keep(reason, probe=tuple(probe))

    # -- learning from observations ---------------------------------------------------------

    def _observe(self, obs: Observation, now_s: float) -> None:
        """Turn the histories' new counts into SkyNomad's run log, in the order they happened."""
        fresh: dict[str, tuple[int, ...]] = {}
        for z in obs.zones:
            h = z.history
            counts = (h.launches_ok, h.capacity_failures, h.probes_ok, h.probes_failed, h.preemptions)
            state = self._zones[z.zone]
            fresh[z.zone] = tuple(a - b for a, b in zip(counts, state.counts))
            state.counts = counts
        pending = self._pending
        if pending is not None:
            at = pending.at_s
            running = pending.running
            # launches, in the order they were tried
            for offer in pending.offers:
                new = fresh[offer.zone]
                if offer.capacity is Capacity.SPOT:
                    if not (new[0] or new[1]):
                        break  # not tried (cannot happen: an earlier one would have succeeded)
                    state = self._zones[offer.zone]
                    if state.open is not None:
                        # Chosen: a launch takes over the probe run whether or not it gets
                        # capacity, so the run ends censored here and a failed launch then
                        # finds no run to fail. (Ending the probe run as a failure instead
                        # moves windows 3, 5 and 14 $0.7-2.7 away from the published figures.)
                        self._end(offer.zone, at, failed=False)
                    if new[1]:
                        self._set_down(offer.zone, at)  # a failed launch
                        continue
                    state.open = _Run(at, 0.0, accounted_h=0.0)
                    state.up = True
                    state.probed_ok = False
                self._replaced(running, offer, at)
                running = (offer.zone, offer.capacity)
                break
            # probes
            for zone in pending.probe:
                new = fresh[zone]
                if running is not None and running == (zone, Capacity.SPOT):
                    continue  # not probed: our instance runs there
                state = self._zones[zone]
                if new[2]:
                    state.probed_ok = True
                    if not state.up:
                        state.up = True
                        # Chosen: the probes counted toward a run's minimum age are those of
                        # that run (one: a zone whose probe succeeded is not probed again).
                        state.open = _Run(at, PROBE_AGE_S, accounted_h=PROBE_AGE_S / 3600)
                elif new[3]:
                    self._set_down(zone, at)
        # a preemption of our spot instance (the simulator records it at this tick)
        if obs.running is None or obs.running.capacity is not Capacity.SPOT:
            for zone, new in fresh.items():
                if new[4]:
                    state = self._zones[zone]
                    if state.open is not None:
                        self._end(zone, now_s, failed=True)
                    state.up = False

    def _replaced(self, old: tuple[str, Capacity] | None, new: Offer, at: float) -> None:
        """The launch of `new` succeeded: the old instance is terminated."""
        if old is None:
            return
        zone, capacity = old
        if capacity is Capacity.SPOT and new.capacity is Capacity.ON_DEMAND and self._zones[zone].open is not None:
            self._end(zone, at, failed=False)  # our SPOT -> OD switch censors the run
        if new.capacity is Capacity.SPOT and new.zone == zone:
            return  # the zone now runs our spot instance: its flag is ignored
        self._set_down(zone, at)  # terminating the instance there

    def _set_down(self, zone: str, at: float) -> None:
        state = self._zones[zone]
        if state.up and state.open is not None:
            self._end(zone, at, failed=True)  # up -> down logs a failure end
        state.up = False

    def _end(self, zone: str, at: float, *, failed: bool) -> None:
        state = self._zones[zone]
        run = state.open
        assert run is not None
        run.end_s, run.failed = max(at, run.start_s), failed
        state.done.append(run)
        state.ended.append(run)
        state.open = None
        if failed:
            state.failures_logged += 1

    def _update_burst(self, now_s: float, gap_h: float) -> None:
        """Append each zone's risk since the last update and the failures it logged; then g."""
        for state in self._zones.values():
            runs = state.ended + ([state.open] if state.open is not None else [])
            if not runs:
                continue
            hazard = state.hazard(now_s)
            risk = 0.0
            for run in runs:
                age = run.age(now_s)
                risk += hazard.cumulative(age) - hazard.cumulative(run.accounted_h)
                run.accounted_h = age
            # Chosen: a zone's entry covers every run open at some time since the last
            # update, so the run whose failure was just logged counts. (Read as "zones
            # with a run open now", no entry could ever carry a failure, since a failure
            # closes the run, and g would stay 1.)
            self._burst.append((max(risk, hazard.tail * gap_h), state.failures_logged))
            state.ended, state.failures_logged = [], 0
        total = sum(r for r, _ in self._burst)
        while len(self._burst) > 1 and total - self._burst[0][0] >= BURST_WINDOW_RISK:
            total -= self._burst.popleft()[0]
        if total < 1:
            self._g = 1.0
            return
        best, risk, failures = 0.0, 0.0, 0
        for r, f in reversed(self._burst):
            risk += r
            failures += f
            if risk > BURST_SUFFIX_RISK:
                break
            best = max(best, failures / risk)
        self._g = max(1.0, best)
