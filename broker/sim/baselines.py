"""Published baseline policies, written from spot-sim-protocol §4, plus greedy.

They use the same interface as the product's policy (`broker.policy.model`),
so the simulator runs every arm through exactly the same code path.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from spotbroker.broker.placement.policy.egress import region_of
from spotbroker.broker.placement.policy.model import (
    Action,
    Capacity,
    Decision,
    Observation,
    Offer,
)


class _Req(Enum):
    NONE = 0
    SPOT = 1
    OD = 2


def _cur(obs: Observation) -> _Req:
    if obs.running is None:
        return _Req.NONE
    return _Req.SPOT if obs.running.capacity is Capacity.SPOT else _Req.OD


def _threshold_decide(obs: Observation, cur: _Req, has: bool, *, multi_zone: bool) -> tuple[_Req, bool]:
    """§4 `decide(cur, has)`; returns (request, hysteresis flag)."""
    assert obs.deadline_s is not None, "UP needs a deadline"
    t = obs.now_s - obs.started_s
    C0, R0 = obs.work_total_s, obs.deadline_s - obs.started_s
    ct, g, d = obs.work_left_s, obs.step_s, obs.restart_overhead_s
    O = obs.running.overhead_left_s if obs.running is not None else 0.0
    cond1 = (C0 - ct) - t * C0 / R0
    cond2 = (t + 2 * d) * C0 / R0 - (C0 - ct)
    t_left = math.floor((R0 - t) / g) * g
    n1 = math.ceil((ct + d) / g) * g
    n2 = math.ceil((ct + 2 * d) / g) * g

    req = _Req.SPOT if has else _Req.NONE
    if cond1 < 0:
        req = _Req.SPOT if has else _Req.OD
    if cur is _Req.OD and (not has or cond2 >= 0):
        req = _Req.OD
    late = n2 > t_left if multi_zone else n2 >= t_left
    if late and cur in (_Req.NONE, _Req.OD):
        req = _Req.OD
    if n1 >= t_left:
        req = _Req.SPOT if (cur is _Req.SPOT and O < 1e-3) else _Req.OD
    hyst = False
    if multi_zone and cur is _Req.OD and has and req is _Req.OD and cond2 < 0:
        req, hyst = _Req.SPOT, True
    return req, hyst


@dataclass
class UniformProgress:
    """UP (single zone, §4): keep progress ahead of the straight line to the deadline."""

    name: str = "up"

    def decide(self, obs: Observation) -> Decision:
        zone = obs.zones[0].zone
        cur = _cur(obs)
        t_left, n1 = self._late(obs)
        finals = {}
        for has in (True, False):
            req, _ = _threshold_decide(obs, cur, has, multi_zone=False)
            if req is _Req.SPOT and not has:  # spot asked for but not there: on-demand only when late
                req = _Req.OD if n1 >= t_left else _Req.NONE
            finals[has] = req
        # We only learn whether spot is there by trying: the `has` answer says what
        # to do if the spot launch works, the `not has` one what to do if it fails.
        if_spot, if_none = finals[True], finals[False]
        if cur is _Req.SPOT:  # our instance was not reclaimed, so spot is there
            return self._act(zone, cur, if_spot)
        if if_spot is _Req.SPOT:
            offers = [Offer(zone, Capacity.SPOT)]
            otherwise = Action.WAIT
            if if_none is _Req.OD:
                if cur is _Req.OD:
                    otherwise = Action.KEEP
                else:
                    offers.append(Offer(zone, Capacity.ON_DEMAND))
            return Decision.launch(*offers, otherwise=otherwise, reason="up: try spot")
        return self._act(zone, cur, if_spot)  # OD (or nothing) whether or not spot is there

    @staticmethod
    def _act(zone: str, cur: _Req, req: _Req) -> Decision:
        if req is cur:
            return Decision.keep(f"up: {req.name}")
        if req is _Req.NONE:
            return Decision.wait("up: ahead")
        capacity = Capacity.SPOT if req is _Req.SPOT else Capacity.ON_DEMAND
        return Decision.launch(Offer(zone, capacity), reason=f"up: {req.name}")

    @staticmethod
    def _late(obs: Observation) -> tuple[float, float]:
        t = obs.now_s - obs.started_s
        g = obs.step_s
        t_left = math.floor((obs.deadline_s - obs.started_s - t) / g) * g
        n1 = math.ceil((obs.work_left_s + obs.restart_overhead_s) / g) * g
        return t_left, n1


@dataclass
class UniformProgressMultiZone:
    """UP(S) (§4): UP's thresholds over several zones, cheapest available spot first."""

    name: str = "up-s"
    last_zone: str | None = None

    def decide(self, obs: Observation) -> Decision:
        if obs.running is not None:
            self.last_zone = obs.running.zone
        cur = _cur(obs)
        req, hyst = _threshold_decide(obs, cur, True, multi_zone=True)
        if obs.running is not None and req is cur:
            return Decision.keep(f"up-s: {cur.name}")
        if req is _Req.NONE:
            return Decision.wait("up-s: ahead")
        od_zone = obs.running.zone if obs.running else (obs.last_zone or obs.zones[0].zone)
        if req is _Req.OD:
            return Decision.launch(Offer(od_zone, Capacity.ON_DEMAND), reason="up-s: on-demand")
        # cheapest spot first; the last zone's region goes last (it was just lost)
        order = sorted(range(len(obs.zones)), key=lambda i: obs.zones[i].spot_price)
        if self.last_zone is not None:
            lost = region_of(self.last_zone)
            order = [i for i in order if obs.zones[i].region != lost] + [
                i for i in order if obs.zones[i].region == lost]
        offers = [Offer(obs.zones[i].zone, Capacity.SPOT) for i in order]
        if not hyst and _threshold_decide(obs, _Req.NONE, False, multi_zone=True)[0] is _Req.OD:
            offers.append(Offer(od_zone, Capacity.ON_DEMAND))
        return Decision.launch(*offers, otherwise=Action.WAIT, reason="up-s: spot")


@dataclass
class Greedy:
    """Run the cheapest available spot; keep it until it is reclaimed; wait when
    there is none (the simulator's safety net turns to on-demand when it must)."""

    name: str = "greedy"

    def decide(self, obs: Observation) -> Decision:
        if obs.running is not None:
            return Decision.keep("greedy: running")
        order = sorted(obs.zones, key=lambda z: z.spot_price)
        return Decision.launch(*(Offer(z.zone, Capacity.SPOT) for z in order), otherwise=Action.WAIT,
                               reason="greedy: cheapest spot")
