"""The product's placement policy ("spotbroker").

The bill is mostly decided by three things: running at the cheapest spot
price, not paying for restarts and checkpoint moves, and not finishing on
on-demand because the slack before the deadline ran out. The policy works in
three layers, each from what it has observed only:

1. **Deadline guard.** When the slack (time left − work left − one restart)
   is about to run out, go to (or stay on) on-demand. A deadline is never
   missed, whatever the estimates say.
2. **Home zone.** For each zone, the expected cost of doing the rest of the
   job there: spot price × (work + expected restarts), the egress to bring
   the checkpoint there, and the on-demand premium × the expected time its
   outages overrun the slack (a compound-Poisson estimate from the zone's
   learned spell lengths, `estimators.py`; an outage while another zone is
   likely up counts only as long as a bridge there and back would cost,
   since the job need not wait it out). The cheapest is the home, and
   leaving the checkpoint's region must also beat the fee back; a running
   spot instance moves only when another zone saves clearly more than the
   move costs.
3. **Wait, spot or on-demand** in the home zone: read from a small Markov
   decision process over (work left, slack left, spot up?), solved with the
   home's learned rates and prices (`planner.py`). It prices waiting (slack
   spent), bridging an outage on on-demand, and going back to spot (a
   restart of overhead and slack). Another zone's spot bridges an outage
   when that is cheaper than the home plan's fallback. Once enough spells
   have been seen to end, whether a spell is worth launching on (and
   leaving on-demand for) is read from their lengths, not from the
   memoryless model: real spells often end within minutes, while those
   that last tend to last long.

Nothing is tuned to a trace: the only constants are a weak optimistic prior
(one pseudo-spell of 4 h up, 0.5 h down, so a zone never tried is worth a
look) and the planner's grid size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from spotbroker.broker.placement.policy import planner
from spotbroker.broker.placement.policy.estimators import MIN_SPELLS, ZoneEstimate, estimate, spell_outlook, survival
from spotbroker.broker.placement.policy.model import Action, Capacity, Decision, Observation, Offer, ZoneState

PROBE_S = 60.0  # a successful probe bills about a minute of spot


def _overrun(slack_s: float, work_s: float, est: ZoneEstimate, restart_s: float) -> float:
    """E[max(0, lost time − slack)] for `work_s` of work in a zone with `est`,
    each interruption losing an outage plus a restart (normal approximation
    of a compound Poisson sum)."""
    if math.isinf(slack_s):
        return 0.0
    n = work_s / est.up_mean_s  # expected interruptions
    D = est.down_mean_s
    mean = n * (D + restart_s)
    sd = math.sqrt(n * (2 * D * D + 2 * D * restart_s + restart_s**2))
    if sd <= 0:
        return max(mean - slack_s, 0.0)
    z = (slack_s - mean) / sd
    tail = 0.5 * math.erfc(z / math.sqrt(2))
    density = math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return sd * (density - z * tail)


def _round_trips(obs: Observation) -> dict[str, float]:
    """Per region of the zones: the cheapest fee to take the checkpoint to another
    zone and back (0 with a second zone in the region; inf with no other zone)."""
    count: dict[str, int] = {}
    for z in obs.zones:
        count[z.region] = count.get(z.region, 0) + 1
    rate, gb = obs.egress.usd_per_gb, obs.checkpoint_gb
    trips = {}
    for r, n in count.items():
        cheapest = 0.0 if n > 1 else min((rate(r, o) + rate(o, r) for o in count if o != r), default=math.inf)
        trips[r] = math.inf if math.isinf(cheapest) else cheapest * gb
    return trips


def _outages_covered(i: int, est: list[ZoneEstimate], p_down: list[float], all_down: float, trip: float,
                     premium_s: float) -> ZoneEstimate:
    """Zone i's spells as a home sees them: an outage there is waited out only when
    no other zone has spot; otherwise it costs at most a bridge there and back
    (the fees, counted as that many seconds of the on-demand premium that waiting
    past the slack would cost). Without this a zone with long outages looks far
    worse than it is next to zones never tried, and the job pays egress to flee."""
    e = est[i]
    if math.isinf(trip) or premium_s <= 0:
        return e
    others_down = all_down / p_down[i] if p_down[i] > 0 else math.prod(p for j, p in enumerate(p_down) if j != i)
    bridged = min(e.down_mean_s, trip / premium_s)
    return ZoneEstimate(e.up_mean_s, others_down * e.down_mean_s + (1 - others_down) * bridged)


def _still_down(zone: ZoneState, est: ZoneEstimate, now_s: float, step_s: float) -> bool:
    """The zone was last seen without spot (a reclaim, a refusal, a failed probe) and
    nothing seen since says otherwise: it is taken to be still out while more than
    half of its outages would be (the learned mean's median, at least one step).
    The memory lasts that long whoever decides: a broker restarted after a reclaim
    (its first pass a lease and a heartbeat timeout later) reads the same samples
    from the database and decides as a live one would have at its next pass."""
    h = zone.history
    if h.last_available is not False or h.last_sample_s is None:
        return False
    return now_s - h.last_sample_s <= max(step_s, est.down_mean_s * math.log(2))


@dataclass
class _Step:
    """What one decision works from: the observation and what was derived from it."""

    obs: Observation
    est: list[ZoneEstimate]
    slack: float  # time left − work left − one restart (inf without a deadline)
    here: str | None  # where the checkpoint is
    costs: list[float]  # per zone: expected $ to finish with it as home
    home: int
    _pooled: list[tuple[float, float]] | None = None  # every zone's spells, built on first use

    @property
    def h(self) -> ZoneState:
        return self.obs.zones[self.home]

    def fee(self, src: str | None, dst: str) -> float:
        return self.obs.egress.fee(src, dst, self.obs.checkpoint_gb)

    def back(self, zone: str) -> float:
        """The fee to bring the checkpoint back where it is now."""
        return self.fee(zone, self.here) if self.here is not None else 0.0

    def spells(self, i: int) -> list[tuple[float, float]]:
        """Observed spells (length, weight) of zone i, or every zone's while it has too few."""
        h = self.obs.zones[i].history
        if sum(h.up_spell_weights) >= MIN_SPELLS:
            return list(zip(h.up_spells_s, h.up_spell_weights))
        if self._pooled is None:
            self._pooled = [p for z in self.obs.zones for p in zip(z.history.up_spells_s, z.history.up_spell_weights)]
        return self._pooled


@dataclass
class SpotBroker:
    """See the module's docs. One instance per job; solved plans are cached by
    `planner.solve` itself (bounded), shared by every job."""

    name: str = "spotbroker"

    def decide(self, obs: Observation) -> Decision:
        slack = math.inf
        if obs.deadline_s is not None:
            time_left = obs.deadline_s - obs.now_s
            slack = time_left - obs.work_left_s - obs.restart_overhead_s
            guard = self._deadline_guard(obs, time_left)
            if guard is not None:
                return guard
        step = self._home(obs, slack)
        run = obs.running
        if run is not None and run.capacity is Capacity.SPOT:
            return self._on_spot(step)
        if math.isinf(slack):
            return self._no_deadline(step)
        return self._wait_spot_or_on_demand(step)

    # 2. the home zone

    @staticmethod
    def _home(obs: Observation, slack: float) -> _Step:
        zones, W, d = obs.zones, obs.work_left_s, obs.restart_overhead_s
        here = obs.last_zone if obs.running is None else obs.running.zone
        est = [estimate(z.history, z.risk) for z in zones]
        cheapest_od = min(z.on_demand_price for z in zones)
        # P(zone j is out at a random moment), from its learned spells
        p_down = [e.down_mean_s / (e.up_mean_s + e.down_mean_s) for e in est]
        all_down = math.prod(p_down)
        trips = _round_trips(obs)
        costs = []
        for i, (z, e) in enumerate(zip(zones, est)):
            premium = max(cheapest_od - z.spot_price, 0.0) / 3600
            restarts = W / e.up_mean_s
            costs.append(obs.egress.fee(here, z.zone, obs.checkpoint_gb)
                         + (W + restarts * d) * z.spot_price / 3600
                         + premium * _overrun(slack, W, _outages_covered(i, est, p_down, all_down, trips[z.region],
                                                                         premium), d))
        step = _Step(obs, est, slack, here, costs, 0)
        # Leaving the checkpoint's region must beat staying by the fee to come back
        # too: early estimates are noisy, and a wrong move would be paid twice.
        step.home = min(range(len(zones)), key=lambda i: costs[i] + step.back(zones[i].zone))
        return step

    @staticmethod
    def _on_spot(step: _Step) -> Decision:
        """Keep a running spot instance unless another zone is clearly cheaper to finish in."""
        obs, costs = step.obs, step.costs
        zones = obs.zones
        current = next(i for i, z in enumerate(zones) if z.zone == obs.running.zone)
        # moving costs a restart and its slack; ask for twice that in savings so
        # two similar zones never trade the job back and forth
        cheapest_od = min(z.on_demand_price for z in zones)
        restart = obs.restart_overhead_s * (step.h.spot_price + cheapest_od) / 3600
        # Keeping is worth at most finishing here, but also at most riding this
        # instance until it is reclaimed and then going on from the home zone (a
        # bridge is kept for its spell, not judged by outages we will not wait out).
        home, here = step.home, zones[current]
        ride = min(obs.work_left_s, step.est[current].up_mean_s)
        keep = costs[current]
        if home != current:
            keep = min(keep, costs[home] + obs.restart_overhead_s * step.h.spot_price / 3600
                       + (here.spot_price - step.h.spot_price) * ride / 3600)
        better = sorted((i for i in range(len(zones))
                         if i != current and costs[i] + step.back(zones[i].zone) + 2 * restart < keep),
                        key=lambda i: costs[i])
        if not better:
            return Decision.keep("spot")
        return Decision.launch(*(Offer(zones[i].zone, Capacity.SPOT) for i in better), otherwise=Action.KEEP,
                               reason="spot: cheaper zone")

    @staticmethod
    def _no_deadline(step: _Step) -> Decision:
        """No deadline: spot in the cheapest zone to finish in that has capacity,
        trying the others in order of their cost (a job that waits is worth
        nothing to its owner until it runs). A zone just seen without capacity
        (a preemption, a failed launch) is tried last."""
        obs, costs = step.obs, step.costs

        order = sorted(range(len(obs.zones)),
                       key=lambda i: (_still_down(obs.zones[i], step.est[i], obs.now_s, obs.step_s), costs[i]))
        offers = [Offer(obs.zones[i].zone, Capacity.SPOT) for i in order]
        if obs.running is not None:  # on on-demand: leave it when spot is there
            return Decision.launch(*offers, otherwise=Action.KEEP, reason="no deadline: spot when there")
        return Decision.launch(*offers, otherwise=Action.WAIT, reason="no deadline: spot, cheapest to finish first")

    # 3. wait, spot or on-demand, read from the home plan

    def _wait_spot_or_on_demand(self, step: _Step) -> Decision:
        obs, h, home = step.obs, step.h, step.home
        zones, d, g, W, slack = obs.zones, obs.restart_overhead_s, obs.step_s, obs.work_left_s, step.slack
        plan = self._plan(obs, step.est[home], h)
        od_zone = min(zones, key=lambda z: z.on_demand_price * W / 3600 + step.fee(step.here, z.zone)
                      + step.fee(z.zone, h.zone))

        def value(table: int, work: float = W, slack_s: float = slack) -> float:
            return plan.value(table, work, slack_s)

        # What a second of progress (mu) and of slack (lam) are worth now, read off the plan.
        unit = plan.inputs.unit_s
        lam = max(value(planner.IDLE_DOWN) - value(planner.IDLE_DOWN, slack_s=slack + unit), 0.0) / unit
        mu = max(value(planner.IDLE_DOWN) - value(planner.IDLE_DOWN, work=W - unit), 0.0) / unit

        if obs.running is not None:  # on on-demand
            if value(planner.LAUNCH_SPOT) < value(planner.RUN_OD_UP):
                return self._leave_on_demand(step, od_zone, lam)
            return Decision.keep("on-demand: plan stays")

        def launch_value(i: int, age: float) -> float:
            """Launching spot in zone i on a spell `age` old, against doing nothing while it
            lasts: a spell that runs R gives max(R - d, 0) of progress (worth mu) and
            saves as much slack (worth lam), and is billed for all of R."""
            look = spell_outlook(step.spells(i), age, d, W, step.est[i].up_mean_s)
            return (mu + lam) * look.productive_s - zones[i].spot_price / 3600 * look.billed_s

        def worth(i: int, age: float, extra: float = 0.0) -> bool:
            """Launch now, or watch the spell one more step and decide then? A spell that
            has lasted is a better bet than a fresh one; watching costs a probe."""
            survive = survival(step.spells(i), age, g, step.est[i].up_mean_s)
            probe_cost = zones[i].spot_price * PROBE_S / 3600
            return launch_value(i, age) - extra >= survive * (launch_value(i, age + g) - extra - probe_cost)

        go_spot = value(planner.LAUNCH_SPOT) <= min(value(planner.WAIT_UP), value(planner.LAUNCH_OD_UP))
        wait = value(planner.WAIT_DOWN)
        od = value(planner.LAUNCH_OD_DOWN) + step.fee(step.here, od_zone.zone) + step.fee(od_zone.zone, h.zone)
        fallback = min(wait, od)
        launch_home = worth(home, self._spell_age(h, step.est[home], obs.now_s, g))
        probe = () if launch_home else (h.zone,)  # else watch its spell grow before launching
        offers: list[Offer] = []
        if go_spot:
            if launch_home:
                offers.append(Offer(h.zone, Capacity.SPOT))
            offers += self._bridges(step, value(planner.LAUNCH_SPOT), fallback, lam, worth)
        if not offers and not go_spot and value(planner.LAUNCH_OD_UP) < value(planner.WAIT_UP):
            return Decision.launch(Offer(od_zone.zone, Capacity.ON_DEMAND), reason="plan: on-demand")
        if od < wait:
            offers.append(Offer(od_zone.zone, Capacity.ON_DEMAND))
            return Decision.launch(*offers, reason=f"home {h.zone}, else on-demand", probe=probe)
        if not offers:
            return Decision.wait("plan: wait", probe=probe)
        return Decision.launch(*offers, otherwise=Action.WAIT, reason=f"home {h.zone}, else wait", probe=probe)

    @staticmethod
    def _bridges(step: _Step, launch_home: float, fallback: float, lam: float, worth) -> list[Offer]:
        """Other zones' spot while the home is out, cheapest first: the home plan's
        launch value plus the moves there and back, the restart back home and the
        price difference while there (or, moving home there, the home-cost
        difference with the fee back), if cheaper than the plan's fallback."""
        obs, h, home = step.obs, step.h, step.home
        d, W = obs.restart_overhead_s, obs.work_left_s
        bridges = []
        for i, z in enumerate(obs.zones):
            if i == home:
                continue
            moves = step.fee(step.here, z.zone) + step.fee(z.zone, h.zone)
            stay = min(W, step.est[i].up_mean_s)
            back_home = d * (h.spot_price / 3600 + lam) if moves > 0 else 0.0
            bridge = launch_home + moves + back_home + (z.spot_price - h.spot_price) * stay / 3600
            as_home = launch_home + step.costs[i] + step.back(z.zone) - step.costs[home] - step.back(h.zone)
            cost = min(bridge, as_home)
            if cost < fallback and worth(i, 0.0, min(moves, step.costs[i] - step.costs[home])):
                bridges.append((cost, i))
        return [Offer(obs.zones[i].zone, Capacity.SPOT) for _, i in sorted(bridges)]

    @staticmethod
    def _leave_on_demand(step: _Step, od_zone: ZoneState, lam: float) -> Decision:
        """Leaving on-demand for spot pays off only if the spell outlives the restart by
        enough: read the home's spell so far (probed each step) against the spells
        seen to end, and weigh the gain against the restart and, if the spell ends
        first, the way back to on-demand."""
        obs, h = step.obs, step.h
        d, g = obs.restart_overhead_s, obs.step_s
        hist = h.history
        age = hist.up_for_s(obs.now_s) if hist.up_start_seen else None
        # a sample at t = 0 is a sample (the simulator's clock starts there)
        if age is None or hist.last_sample_s is None or obs.now_s - hist.last_sample_s > g:
            return Decision.keep("on-demand: probing home", probe=(h.zone,))
        look = spell_outlook(step.spells(step.home), age, d, obs.work_left_s, step.est[step.home].up_mean_s)
        gain = (od_zone.on_demand_price - h.spot_price) / 3600 * look.productive_s
        cost = d * (h.spot_price / 3600 + lam) + look.p_lost * d * (od_zone.on_demand_price / 3600 + lam)
        if gain <= cost:
            return Decision.keep(f"on-demand: home spell {age / 60:.0f} min old, not yet", probe=(h.zone,))
        return Decision.launch(Offer(h.zone, Capacity.SPOT), reason="on-demand: back to spot")

    @staticmethod
    def _spell_age(zone: ZoneState, est: ZoneEstimate, now_s: float, step_s: float) -> float:
        """How long the zone's current spell of capacity has lasted: 0 for one that would
        start now in an outage (the zone is still taken to be out, `_still_down`); inf
        (established) when it was already up when first seen, or the zone was not watched."""
        hist = zone.history
        fresh = hist.last_sample_s is not None and now_s - hist.last_sample_s <= step_s
        if fresh and hist.up_start_seen:
            age = hist.up_for_s(now_s)
            if age is not None:
                return age
        return 0.0 if _still_down(zone, est, now_s, step_s) else math.inf

    def _plan(self, obs: Observation, e: ZoneEstimate, home: ZoneState) -> planner.Plan:
        horizon = obs.deadline_s - obs.started_s - obs.work_total_s  # the most slack the job ever has
        unit = planner.step_for(obs.step_s, obs.deadline_s - obs.started_s)
        od_price = min(z.on_demand_price for z in obs.zones)
        inputs = planner.plan_inputs(unit, obs.work_total_s, horizon, e.up_mean_s, e.down_mean_s,
                                     home.spot_price, od_price, obs.restart_overhead_s)
        return planner.solve(inputs)

    # 1. the deadline guard

    @staticmethod
    def _deadline_guard(obs: Observation, time_left: float) -> Decision | None:
        """On-demand when the slack is about to run out (one step before it does)."""
        d, g, W = obs.restart_overhead_s, obs.step_s, obs.work_left_s
        need = math.ceil((W + d) / g) * g
        if need < math.floor(time_left / g) * g - g:
            return None
        run = obs.running
        if run is not None and run.capacity is Capacity.ON_DEMAND:
            return Decision.keep("deadline: on-demand")
        if run is not None and run.overhead_left_s <= 0 and time_left >= W + d + g:
            return Decision.keep("deadline: spot is safe until reclaimed")
        here = obs.last_zone if run is None else run.zone

        def total(z: ZoneState) -> float:
            return z.on_demand_price * (W + d) / 3600 + obs.egress.fee(here, z.zone, obs.checkpoint_gb)

        best = min(obs.zones, key=total)
        return Decision.launch(Offer(best.zone, Capacity.ON_DEMAND), reason="deadline: on-demand")
