"""The offline optimum (spot-sim-protocol §3): a DP over the whole window with
full knowledge of the trace, then replayed through the tick simulator.

State at the start of a tick: (mode, h, k) with mode one of START, IDLE(r),
OD(r), SPOT(r); h = overhead ticks still to pay; k = productive ticks done
(capped at K). The DP keeps, for every state, the cheapest cost to reach it,
and one back-pointer per state and tick so the plan can be read backwards.
Vectorised over k (and over target modes), so a tick costs a few dozen numpy
operations.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from spotbroker.broker.placement.policy.egress import EgressPrices, region_of
from spotbroker.broker.placement.policy.model import Capacity, Decision, Observation, Offer
from spotbroker.broker.sim.engine import Job
from spotbroker.broker.sim.traces import TraceSet

BASE_MBPS = 9720.0  # the reference speed the checkpoint transfer is measured against
CROSS_REGION_MBPS = 8200.0
CROSS_CONTINENT_MBPS = 3590.0


def _continent(zone: str) -> str:
    return region_of(zone).split("-")[0]


def migration_ticks(src: str, dst: str, job: Job, gap_s: int) -> int:
    """Overhead ticks of a launch in `dst` when the checkpoint is in `src` (§3)."""
    if region_of(src) == region_of(dst):
        return math.ceil(job.restart_s / gap_s)
    speed = CROSS_REGION_MBPS if _continent(src) == _continent(dst) else CROSS_CONTINENT_MBPS
    extra = job.checkpoint_gb * 8192 * (1 / speed - 1 / BASE_MBPS)
    return math.ceil((job.restart_s + extra) / gap_s)


@dataclass(frozen=True)
class Plan:
    """The mode chosen for each tick: None = nothing runs, else (zone index, capacity)."""

    ticks: list[tuple[int, Capacity] | None]
    objective: float  # the DP's own cost (whole ticks, every interval billed)


def solve(traces: TraceSet, job: Job, egress: EgressPrices | None = None) -> Plan:
    """The hindsight optimum of §3 as one dynamic program over (tick, mode,
    restart ticks left, work done). Kept as one function (about 120 lines) on
    purpose: the switch tables, the forward pass and the backtrack share a
    dozen index arrays, and cut apart they would be passed between functions
    that mean nothing on their own."""
    egress = egress or EgressPrices()
    gap = traces.gap_s
    R = len(traces.zones)
    names = traces.names
    T = math.floor(job.deadline_s / gap)
    K = math.ceil(job.work_s / gap)
    H = math.ceil(job.restart_s / gap)
    L = job.window_ticks(gap)

    # mode indices: 0 START, 1..R IDLE(r), R+1..2R OD(r), 2R+1..3R SPOT(r)
    M = 1 + 3 * R
    IDLE, OD, SPOT = 1, 1 + R, 1 + 2 * R

    def zone_of(m: int) -> int | None:
        return None if m == 0 else (m - 1) % R

    mig = np.array([[H if a == b else migration_ticks(names[a], names[b], job, gap) for b in range(R)]
                    for a in range(R)])
    fee = np.array([[egress.fee(names[a], names[b], job.checkpoint_gb) for b in range(R)] for a in range(R)])
    HD = max(1, int(mig.max()))  # h ranges over 0..HD-1

    # Switch tables for the 2R active targets: extra cost and landing h per source mode.
    targets = list(range(OD, M))
    add = np.full((len(targets), M), np.inf)
    land = np.zeros((len(targets), M), dtype=int)
    for i, mt in enumerate(targets):
        rt = zone_of(mt)
        for ms in range(M):
            if ms == mt:
                continue
            rs = zone_of(ms)
            if ms == 0:
                add[i, ms], hs = 0.0, H
            else:
                add[i, ms] = 0.0 if rs == rt else fee[rs, rt]
                hs = H if rs == rt else mig[rs, rt]
            land[i, ms] = max(hs - 1, 0)
    land_values = sorted(set(land[np.isfinite(add)].tolist()))

    inf = np.inf
    C = np.full((M, HD, K + 1), inf)
    C[0, 0, 0] = 0.0
    # back-pointer: source (mode*HD + h), plus SHIFT when the source k is k'-1
    SHIFT = M * HD
    back = np.zeros((T, M, HD, K + 1), dtype=np.int32 if 2 * SHIFT > 32767 else np.int16)
    unavailable = np.array([z.unavailable[:T] for z in traces.zones])
    od_tick = np.array([z.on_demand_price for z in traces.zones]) * gap / 3600
    ks = np.arange(K + 1)

    for t in range(T):
        spot_tick = np.array([z.spot_price[t] for z in traces.zones]) * gap / 3600
        avail = (~unavailable[:, t]) & (t < L)
        tick_cost = np.concatenate(([0.0], np.zeros(R), od_tick, spot_tick))
        usable = np.concatenate(([True], np.ones(R, bool), np.ones(R, bool), avail))
        N = np.full_like(C, inf)
        B = np.zeros((M, HD, K + 1), dtype=back.dtype)

        def offer(m: int, h: int, cand: np.ndarray, src: np.ndarray, N: np.ndarray = N, B: np.ndarray = B) -> None:
            better = cand < N[m, h]
            N[m, h] = np.where(better, cand, N[m, h])
            B[m, h] = np.where(better, src, B[m, h])

        # stay: START and IDLE keep everything; an active mode pays its tick
        N[0, 0], B[0, 0] = C[0, 0], 0 * HD + 0
        for m in range(IDLE, OD):
            N[m, 0], B[m, 0] = C[m, 0], m * HD
        for m in range(OD, M):
            if not usable[m]:
                continue
            c = tick_cost[m]
            for h in range(HD - 1, 0, -1):
                offer(m, h - 1, C[m, h] + c, np.full(K + 1, m * HD + h))
            progressed = np.full(K + 1, inf)
            progressed[1:] = C[m, 0, :-1]
            offer(m, 0, progressed + c, np.full(K + 1, SHIFT + m * HD))
            capped = np.full(K + 1, inf)
            capped[K] = C[m, 0, K]
            offer(m, 0, capped + c, np.full(K + 1, m * HD))

        best_h = C.argmin(axis=1)  # (M, K+1)
        best = np.take_along_axis(C, best_h[:, None, :], axis=1)[:, 0, :]
        # active(r) -> IDLE(r)
        for r in range(R):
            for m in (OD + r, SPOT + r):
                offer(IDLE + r, 0, best[m], m * HD + best_h[m])
        # any allowed source -> active target
        for i, mt in enumerate(targets):
            if not usable[mt]:
                continue
            for hl in land_values:
                a = np.where(land[i] == hl, add[i], inf)
                cand = best + a[:, None]  # (M, K+1)
                src = cand.argmin(axis=0)
                offer(mt, hl, cand[src, ks] + tick_cost[mt], src * HD + best_h[src, ks])

        # drop states that can no longer finish in time
        N[:, :, ks + (T - t - 1) < K] = inf
        C = N
        back[t] = B

    final = C[:, :, K]
    m, h = np.unravel_index(int(np.argmin(final)), final.shape)
    objective = float(final[m, h])
    if not math.isfinite(objective):
        raise ValueError("no feasible plan (the deadline cannot be met even on on-demand)")
    k = K
    plan: list[tuple[int, Capacity] | None] = [None] * T
    for t in range(T - 1, -1, -1):
        zone = zone_of(m)
        if m >= SPOT:
            plan[t] = (zone, Capacity.SPOT)
        elif m >= OD:
            plan[t] = (zone, Capacity.ON_DEMAND)
        code = int(back[t, m, h, k])
        if code >= SHIFT:
            code -= SHIFT
            k -= 1
        m, h = divmod(code, HD)
    return Plan(plan, objective)


@dataclass
class PlanReplay:
    """Replays a `Plan` through the simulator (§3 "Replay")."""

    plan: Plan
    zone_names: list[str]
    name: str = "optimal"

    def decide(self, obs: Observation) -> Decision:
        t = round((obs.now_s - obs.started_s) / obs.step_s)
        want = self.plan.ticks[t] if t < len(self.plan.ticks) else None
        if want is None:
            return Decision.wait("plan: idle") if obs.running else Decision.keep("plan: idle")
        zone, capacity = self.zone_names[want[0]], want[1]
        if obs.running is not None and obs.running.zone == zone and obs.running.capacity is capacity:
            return Decision.keep("plan")
        return Decision.launch(Offer(zone, capacity), reason="plan")
