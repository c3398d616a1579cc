"""The product's placement policy ("spotbroker").

The bill is mostly decided by three things: running at the cheapest spot
price, not paying for restarts and checkpoint moves, and not finishing on
on-demand because the slack before the deadline ran out. So the policy
prices everything it could do in dollars, with the deadline's slack given a
dollar value too:

* **Slack** S = time left − work left − one restart: what the job can still
  lose (waiting, restarts) and yet finish on on-demand.
* For each zone z, the **home cost** of doing the rest of the job there:
  spot price × (work + expected restarts) + the egress to bring the
  checkpoint there + the on-demand premium × the expected time the outages
  and restarts will overrun the slack (a compound-Poisson estimate from the
  zone's learned spell lengths, `estimators.py`). The cheapest is the home.
* **The value of a second of slack** λ = on-demand premium × P(outages
  overrun the slack) (the derivative of the expected overrun). Waiting τ
  seconds for the home zone to come back costs λτ; bridging the outage on
  another zone's spot or on on-demand costs its restarts, egress and price
  difference over τ. The cheapest wins, and the choice is an ordered list of
  offers because a spot launch may fail for lack of capacity.

A deadline guard comes before all of it: when the slack is about to run
out the job goes to (or stays on) on-demand, so a deadline is never missed.
The only inputs are the observation's own fields; nothing is tuned to a
trace, and every estimate is learned from what the caller recorded.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from spotbroker.broker.policy.estimators import ZoneEstimate, estimate
from spotbroker.broker.policy.model import Action, Capacity, Decision, Observation, Offer, ZoneState


@dataclass(frozen=True)
class _Home:
    index: int
    cost: float  # $ to finish the job from here with this zone as home
    p_overrun: float  # P(outages and restarts overrun the slack)


def _overrun(slack_s: float, work_s: float, est: ZoneEstimate, restart_s: float) -> tuple[float, float]:
    """(P(lost time > slack), E[max(0, lost time − slack)]) for a job of `work_s`
    run on a zone with `est`, each interruption costing an outage plus a restart."""
    if math.isinf(slack_s):
        return 0.0, 0.0
    n = work_s / est.up_mean_s  # expected interruptions
    D = est.down_mean_s
    mean = n * (D + restart_s) + est.residual_down_s()
    var = n * (2 * D * D + 2 * D * restart_s + restart_s**2) + est.residual_down_s() ** 2
    if var <= 0:
        return (1.0, mean - slack_s) if mean > slack_s else (0.0, 0.0)
    sd = math.sqrt(var)
    z = (slack_s - mean) / sd
    tail = 0.5 * math.erfc(z / math.sqrt(2))
    density = math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return tail, sd * (density - z * tail)


@dataclass
class SpotBroker:
    name: str = "spotbroker"

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
        cheapest_od = min(z.on_demand_price for z in zones)

        def fee(src: str | None, dst: str) -> float:
            return obs.egress.fee(src, dst, obs.checkpoint_gb)

        homes = []
        for i, z in enumerate(zones):
            e = est[i]
            premium = max(cheapest_od - z.spot_price, 0.0) / 3600
            p_over, overrun = _overrun(slack, W, e, d)
            restarts = W / e.up_mean_s
            cost = fee(here, z.zone) + (W + restarts * d) * z.spot_price / 3600 + premium * overrun
            homes.append(_Home(i, cost, p_over))
        home = min(homes, key=lambda h: h.cost)
        h = zones[home.index]
        premium = max(cheapest_od - h.spot_price, 0.0) / 3600
        lam = premium * home.p_overrun  # $ per second of slack
        restart_cost = d * (h.spot_price / 3600 + lam)

        if run is not None and run.capacity is Capacity.SPOT:
            return self._while_on_spot(obs, homes, home, restart_cost)

        # Idle or on on-demand: go home if it has capacity, else bridge or wait.
        tau = est[home.index].residual_down_s()
        wait_cost = lam * tau
        options: list[tuple[float, Offer]] = []
        for i, z in enumerate(zones):
            if i == home.index:
                continue
            as_home = homes[i].cost - home.cost
            bridge = (fee(here, z.zone) + fee(z.zone, h.zone) + d * (z.spot_price / 3600 + lam)
                      + tau * (z.spot_price - h.spot_price) / 3600)
            options.append((min(as_home, bridge), Offer(z.zone, Capacity.SPOT)))
        od_zone = min(zones, key=lambda z: z.on_demand_price * W / 3600 + fee(here, z.zone) + fee(z.zone, h.zone))
        on_od_now = run is not None and run.capacity is Capacity.ON_DEMAND
        od_cost = tau * (od_zone.on_demand_price - h.spot_price) / 3600
        if not on_od_now:
            od_cost += fee(here, od_zone.zone) + fee(od_zone.zone, h.zone) + d * (od_zone.on_demand_price / 3600 + lam)
        fallback = min(wait_cost, od_cost)
        offers = [Offer(h.zone, Capacity.SPOT)]
        offers += [o for cost, o in sorted(options, key=lambda x: x[0]) if cost < fallback]
        if on_od_now:
            otherwise = Action.KEEP if od_cost < wait_cost else Action.WAIT
            return Decision.launch(*offers, otherwise=otherwise, reason="on-demand: try spot")
        if od_cost < wait_cost:
            offers.append(Offer(od_zone.zone, Capacity.ON_DEMAND))
        return Decision.launch(*offers, otherwise=Action.WAIT,
                               reason=f"home {h.zone}, wait ${wait_cost:.2f} vs od ${od_cost:.2f}")

    def _while_on_spot(self, obs: Observation, homes: list[_Home], home: _Home, restart_cost: float) -> Decision:
        """Keep a running spot instance unless another zone is clearly cheaper to finish in."""
        zones = obs.zones
        current = next(i for i, z in enumerate(zones) if z.zone == obs.running.zone)
        # moving costs a restart; ask for twice that in savings so two similar
        # zones never trade the job back and forth
        better = [hm for hm in sorted(homes, key=lambda x: x.cost)
                  if hm.index != current and hm.cost + 2 * restart_cost < homes[current].cost]
        if not better:
            return Decision.keep("spot")
        return Decision.launch(*(Offer(zones[hm.index].zone, Capacity.SPOT) for hm in better),
                               otherwise=Action.KEEP, reason="spot: cheaper zone")

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
