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
   learned spell lengths, `estimators.py`). The cheapest is the home; a
   running spot instance moves only when another zone saves clearly more
   than the move costs.
3. **Wait, spot or on-demand** in the home zone: read from a small Markov
   decision process over (work left, slack left, spot up?), solved with the
   home's learned rates and prices (`planner.py`). It prices waiting (slack
   spent), bridging an outage on on-demand, and going back to spot (a
   restart of overhead and slack). Another zone's spot is tried when the
   home is out and using it is cheaper than the home plan's fallback.

Nothing is tuned to a trace: the only constants are weak priors (one
pseudo-spell of 2 h up, 1 h down) and the planner's grid size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from spotbroker.broker.policy import planner
from spotbroker.broker.policy.estimators import MIN_SPELLS, ZoneEstimate, estimate, spell_outlook, survival

PROBE_S = 60.0  # a successful probe bills about a minute of spot
from spotbroker.broker.policy.model import Action, Capacity, Decision, Observation, Offer, ZoneState


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


@dataclass
class SpotBroker:
    """See the module's docs. One instance per job; it keeps only a cache of solved plans."""

    name: str = "spotbroker"
    _plans: dict = field(default_factory=dict, repr=False)

    def decide(self, obs: Observation) -> Decision:
        zones = obs.zones
        d, g, W = obs.restart_overhead_s, obs.step_s, obs.work_left_s
        run = obs.running
        here = obs.last_zone if run is None else run.zone  # where the checkpoint is
        slack = math.inf
        if obs.deadline_s is not None:
            time_left = obs.deadline_s - obs.now_s
            slack = time_left - W - d
            guard = self._deadline_guard(obs, time_left)
            if guard is not None:
                return guard
        est = [estimate(z.history, obs.now_s, g) for z in zones]
        cheapest_od = min(zones, key=lambda z: z.on_demand_price)

        def fee(src: str | None, dst: str) -> float:
            return obs.egress.fee(src, dst, obs.checkpoint_gb)

        def back(zone: str) -> float:
            """The fee to bring the checkpoint back where it is now."""
            return fee(zone, here) if here is not None else 0.0

        # 2. the home zone
        costs = []
        for z, e in zip(zones, est):
            premium = max(cheapest_od.on_demand_price - z.spot_price, 0.0) / 3600
            restarts = W / e.up_mean_s
            costs.append(fee(here, z.zone) + (W + restarts * d) * z.spot_price / 3600
                         + premium * _overrun(slack, W, e, d))
        # Leaving the checkpoint's region must beat staying by the fee to come back
        # too: early estimates are noisy, and a wrong move would be paid twice.
        home = min(range(len(zones)), key=lambda i: costs[i] + back(zones[i].zone))
        h = zones[home]
        if run is not None and run.capacity is Capacity.SPOT:
            current = next(i for i, z in enumerate(zones) if z.zone == run.zone)
            # moving costs a restart and its slack; ask for twice that in savings so
            # two similar zones never trade the job back and forth
            restart = d * (h.spot_price + cheapest_od.on_demand_price) / 3600
            better = sorted((i for i in range(len(zones)) if i != current and costs[i] + 2 * restart < costs[current]),
                            key=lambda i: costs[i])
            if not better:
                return Decision.keep("spot")
            return Decision.launch(*(Offer(zones[i].zone, Capacity.SPOT) for i in better), otherwise=Action.KEEP,
                                   reason="spot: cheaper zone")
        if math.isinf(slack):
            # no deadline: time is free, so wait for spot in the home zone (or one nearly as good)
            offers = [Offer(zones[i].zone, Capacity.SPOT) for i in sorted(range(len(zones)), key=lambda i: costs[i])
                      if costs[i] <= costs[home] + d * h.spot_price / 3600]
            if run is not None:  # on on-demand: leave it when spot is there
                return Decision.launch(*offers, otherwise=Action.KEEP, reason="no deadline: spot when there")
            return Decision.launch(*offers, otherwise=Action.WAIT, reason="no deadline: wait for spot")

        # 3. wait, spot or on-demand, read from the home plan
        plan = self._plan(obs, est[home], h, cheapest_od)
        od_zone = min(zones, key=lambda z: z.on_demand_price * W / 3600 + fee(here, z.zone) + fee(z.zone, h.zone))
        on_od = run is not None

        def value(table: int) -> float:
            return plan.value(table, W, slack)

        if on_od:
            # Leaving on-demand for spot pays off only if the spell outlives the restart
            # by enough: read the home's spell so far (probed each step) against the
            # spells seen to end, and weigh the gain against the restart and, if the
            # spell ends first, the way back to on-demand.
            go_spot = value(planner.LAUNCH_SPOT) < value(planner.RUN_OD_UP)
            age = h.history.up_for_s(obs.now_s) if h.history.up_start_seen else None
            if go_spot:
                if age is None or obs.now_s - (h.history.last_sample_s or -math.inf) > g:
                    return Decision.keep("on-demand: probing home", probe=(h.zone,))
                lam = max(value(planner.IDLE_DOWN) - plan.value(planner.IDLE_DOWN, W, slack + plan.inputs.unit_s),
                          0.0) / plan.inputs.unit_s
                spells = h.history.up_spells_s
                if len(spells) < MIN_SPELLS:
                    spells = [x for z in zones for x in z.history.up_spells_s]
                look = spell_outlook(spells, age, d, W, est[home].up_mean_s)
                gain = (od_zone.on_demand_price - h.spot_price) / 3600 * look.productive_s
                cost = d * (h.spot_price / 3600 + lam) + look.p_lost * d * (od_zone.on_demand_price / 3600 + lam)
                if gain <= cost:
                    return Decision.keep(f"on-demand: home spell {age / 60:.0f} min old, not yet",
                                         probe=(h.zone,))
                return Decision.launch(Offer(h.zone, Capacity.SPOT), reason="on-demand: back to spot")
            fallback = value(planner.RUN_OD_DOWN)
        else:
            go_spot = value(planner.LAUNCH_SPOT) <= min(value(planner.WAIT_UP), value(planner.LAUNCH_OD_UP))
            wait, od = value(planner.WAIT_DOWN), value(planner.LAUNCH_OD_DOWN)
            od += fee(here, od_zone.zone) + fee(od_zone.zone, h.zone)
            fallback = min(wait, od)
        # What a second of progress (mu) and of slack (lam) are worth now, read off the plan.
        unit = plan.inputs.unit_s
        base = value(planner.IDLE_DOWN)
        lam = max(base - plan.value(planner.IDLE_DOWN, W, slack + unit), 0.0) / unit
        mu = max(base - plan.value(planner.IDLE_DOWN, W - unit, slack), 0.0) / unit

        def launch_value(i: int, age: float) -> float:
            """Launching spot in zone i on a spell `age` old, against doing nothing while it
            lasts: a spell that runs R gives max(R - d, 0) of progress (worth mu) and
            saves as much slack (worth lam), and is billed for all of R."""
            spells = zones[i].history.up_spells_s
            if len(spells) < MIN_SPELLS:
                spells = [x for z in zones for x in z.history.up_spells_s]
            look = spell_outlook(spells, age, d, W, est[i].up_mean_s)
            return (mu + lam) * look.productive_s - zones[i].spot_price / 3600 * look.billed_s

        def worth(i: int, age: float, extra: float = 0.0) -> bool:
            """Launch now, or watch the spell one more step and decide then? Real spells
            are far from memoryless (many end within minutes, survivors last hours),
            so a spell that has lasted is a better bet; watching costs a probe."""
            spells = zones[i].history.up_spells_s
            if len(spells) < MIN_SPELLS:
                spells = [x for z in zones for x in z.history.up_spells_s]
            survive = survival(spells, age, g, est[i].up_mean_s)
            probe_cost = zones[i].spot_price * PROBE_S / 3600
            now = launch_value(i, age) - extra
            later = survive * (launch_value(i, age + g) - extra - probe_cost)
            return now >= later

        hist = h.history
        fresh = hist.last_sample_s is not None and obs.now_s - hist.last_sample_s <= g
        age = hist.up_for_s(obs.now_s) if fresh and hist.up_start_seen else None
        if age is None:
            # in an outage, a spell that starts now is fresh; one already running when
            # first seen (or never watched) is of unknown age: take it as established
            age = 0.0 if fresh and hist.last_available is False else math.inf
        launch_home = worth(home, age)
        probe = () if launch_home else (h.zone,)  # else watch its spell grow before launching
        offers: list[Offer] = []
        if go_spot:
            if launch_home:
                offers.append(Offer(h.zone, Capacity.SPOT))
            # another zone's spot while the home is out: the home plan's launch value,
            # plus the moves there and back and the price difference while there
            bridges = []
            for i, z in enumerate(zones):
                if i == home:
                    continue
                moves = fee(here, z.zone) + fee(z.zone, h.zone)
                stay = min(W, est[i].up_mean_s)
                # ... and the restart when the job comes back home
                back_home = d * (h.spot_price / 3600 + lam) if moves > 0 else 0.0
                bridge = (value(planner.LAUNCH_SPOT) + moves + back_home
                          + (z.spot_price - h.spot_price) * stay / 3600)
                # moving home there must beat the home by the fee back too (as in choosing the home)
                as_home = value(planner.LAUNCH_SPOT) + costs[i] + back(z.zone) - costs[home] - back(h.zone)
                cost = min(bridge, as_home)
                if cost < fallback and worth(i, 0.0, min(moves, costs[i] - costs[home])):
                    bridges.append((cost, i))
            offers += [Offer(zones[i].zone, Capacity.SPOT) for _, i in sorted(bridges)]
        if on_od:
            if not offers:
                return Decision.keep("on-demand: plan stays")
            return Decision.launch(*offers, otherwise=Action.KEEP, reason="on-demand: back to spot if there")
        if not offers and not go_spot and value(planner.LAUNCH_OD_UP) < value(planner.WAIT_UP):
            return Decision.launch(Offer(od_zone.zone, Capacity.ON_DEMAND), reason="plan: on-demand")
        if od < wait:
            offers.append(Offer(od_zone.zone, Capacity.ON_DEMAND))
            return Decision.launch(*offers, reason=f"home {h.zone}, else on-demand", probe=probe)
        if not offers:
            return Decision.wait("plan: wait", probe=probe)
        return Decision.launch(*offers, otherwise=Action.WAIT, reason=f"home {h.zone}, else wait", probe=probe)

    def _plan(self, obs: Observation, e: ZoneEstimate, home: ZoneState, od: ZoneState) -> planner.Plan:
        horizon = obs.deadline_s - obs.started_s - obs.work_total_s  # the most slack the job ever has
        unit = planner.step_for(obs.step_s, obs.deadline_s - obs.started_s)
        inputs = planner.plan_inputs(unit, obs.work_total_s, horizon, e.up_mean_s, e.down_mean_s,
                                     home.spot_price, od.on_demand_price, obs.restart_overhead_s)
        plan = self._plans.get(inputs)
        if plan is None:
            plan = self._plans[inputs] = planner.solve(inputs)
        return plan

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
