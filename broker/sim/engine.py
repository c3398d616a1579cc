"""The tick simulator of spot-sim-protocol §2: one job, one window, one policy.

Time moves in ticks of the trace's gap. At most one instance runs at a time.
Each tick t first closes interval t-1 (bill it, credit progress, apply a
preemption), then applies the environment's deadline safety net, then asks
the policy (through `broker.policy`'s interface, with only what has been
observed so far) and carries out its decision.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from spotbroker.broker.placement.policy.egress import EgressPrices
from spotbroker.broker.placement.policy.model import (
    Action,
    Capacity,
    Decision,
    Event,
    Observation,
    Policy,
    Running,
    ZoneHistory,
    ZoneState,
)
from spotbroker.broker.sim.traces import TraceError, TraceSet

PROBE_SECONDS = 60.0  # a successful probe bills this much spot
DONE_EPS_S = 1e-3


@dataclass(frozen=True)
class Job:
    work_s: float  # P: productive seconds needed
    deadline_s: float  # from the start of the window
    restart_s: float  # d: overhead after every launch
    checkpoint_gb: float

    def __post_init__(self) -> None:
        if self.work_s <= 0:
            raise TraceError(f"job length must be positive, got {self.work_s} s")
        if self.deadline_s < self.work_s + self.restart_s:
            raise TraceError(
                f"deadline ({self.deadline_s / 3600:.4g} h) is shorter than the work plus one restart "
                f"({(self.work_s + self.restart_s) / 3600:.4g} h): no policy can meet it"
            )

    def window_ticks(self, gap_s: int) -> int:
        """L: ticks from the window's start on which spot may be used."""
        return math.ceil(self.deadline_s / gap_s)


@dataclass(frozen=True)
class Step:
    """One tick of a run's timeline (for plots and tests)."""

    tick: int
    zone: int | None  # index into the trace set's zones, None = nothing runs in [t, t+1)
    capacity: Capacity | None
    progress_s: float  # at the start of the tick
    preempted: bool  # an instance was reclaimed at the start of this tick
    latched: bool  # the safety net has taken over


@dataclass
class RunResult:
    cost: float  # reported $ (§2)
    deadline_met: bool
    finish_s: float | None
    egress: float
    launches: int
    preemptions: int
    spot_ticks: int
    on_demand_ticks: int
    decisions: list[Decision] = field(default_factory=list)
    timeline: list[Step] = field(default_factory=list)


@dataclass
class _Instance:
    zone: int
    capacity: Capacity
    launched_tick: int


def run_window(
    traces: TraceSet,
    policy: Policy,
    job: Job,
    *,
    safety_net: bool = True,
    bill_last_interval: bool = False,
    egress: EgressPrices | None = None,
    keep_timeline: bool = False,
) -> RunResult:
    """Simulate `policy` on `traces` (already cut to start at the window's first tick).

    `safety_net=False` and `bill_last_interval=True` are the single-zone UP arm's
    rules (§4, §2 "Reported cost"); every other arm uses the defaults.
    """
    egress = egress or EgressPrices()
    gap = traces.gap_s
    zones = traces.zones
    n = len(zones)
    L = job.window_ticks(gap)
    if traces.n_ticks < L + 1:
        raise TraceError(f"the window needs {L + 1} ticks of trace but only {traces.n_ticks} remain")
    P, d, deadline = job.work_s, job.restart_s, job.deadline_s
    histories = [ZoneHistory(join_within_s=1.5 * gap) for _ in zones]

    def available(z: int, t: int) -> bool:
        return t < L and not zones[z].unavailable[t]

    def price(z: int, cap: Capacity, t: int) -> float:
        return float(zones[z].spot_price[t]) if cap is Capacity.SPOT else zones[z].on_demand_price

    p = 0.0  # progress
    O = 0.0  # restart overhead left
    leader: int | None = None
    inst: _Instance | None = None
    billed: list[float] = []  # cost of each closed interval
    egress_total = 0.0
    probes_ok: list[int] = []  # zones probed successfully in the current tick
    latched = False
    result = RunResult(0.0, False, None, 0.0, 0, 0, 0, 0)
    index = {z.zone: i for i, z in enumerate(zones)}

    def launch(z: int, cap: Capacity, t: int) -> bool:
        nonlocal inst
        if cap is Capacity.SPOT:
            ok = available(z, t)
            histories[z].record(Event.LAUNCH_OK if ok else Event.CAPACITY_FAILURE, t * gap)
            if not ok:
                return False
        stop_current()
        inst = _Instance(z, cap, t)
        result.launches += 1
        return True

    def stop_current() -> None:
        nonlocal inst
        if inst is not None and inst.capacity is Capacity.SPOT:
            histories[inst.zone].spot_stopped()
        inst = None

    t = 0
    while True:
        preempted = False
        ran: _Instance | None = None  # the instance that ran in t-1
        if t > 0:
            ran = inst
            # 1. close interval t-1
            cost = sum(float(zones[z].spot_price[t - 1]) * PROBE_SECONDS / 3600 for z in probes_ok)
            if inst is not None:
                cost += price(inst.zone, inst.capacity, t - 1) * gap / 3600
                if inst.capacity is Capacity.SPOT:
                    result.spot_ticks += 1
                else:
                    result.on_demand_ticks += 1
                if inst.launched_tick == t - 1:
                    O = d
                    if leader is not None and leader != inst.zone:
                        egress_total += egress.fee(zones[leader].zone, zones[inst.zone].zone, job.checkpoint_gb)
                p += min(max(gap - O, 0.0), P - p)
                O = max(O - gap, 0.0)
                leader = inst.zone
            billed.append(cost)
            if inst is not None and inst.capacity is Capacity.SPOT:
                if available(inst.zone, t):
                    histories[inst.zone].record(Event.RUNNING, t * gap)
                else:
                    histories[inst.zone].record(Event.PREEMPTED, t * gap)
                    result.preemptions += 1
                    preempted = True
                    inst = None
        probes_ok = []
        # 2. done or failed
        if P - p <= DONE_EPS_S:
            if bill_last_interval:
                # UP: the completing interval is billed too, at the following tick's price
                if ran is not None and billed:
                    billed[-1] += (price(ran.zone, ran.capacity, t) - price(ran.zone, ran.capacity, t - 1)) * gap / 3600
            else:
                billed = billed[:-1]
            result.finish_s = t * gap
            result.deadline_met = t * gap <= deadline
            break
        if t * gap >= deadline:
            result.deadline_met = False
            break
        # 3. the environment's safety net
        if safety_net and not latched:
            rem = P - p
            t_left = math.floor((deadline - t * gap) / gap) * gap
            need = math.ceil((rem + d) / gap) * gap
            if need >= t_left:
                latched = True
                if inst is not None:
                    if inst.capacity is Capacity.SPOT:
                        launch(inst.zone, Capacity.ON_DEMAND, t)
                else:
                    best = min(
                        range(n),
                        key=lambda z: (
                            zones[z].on_demand_price * rem / 3600
                            + egress.fee(zones[leader].zone if leader is not None else None, zones[z].zone,
                                         job.checkpoint_gb),
                            z,
                        ),
                    )
                    launch(best, Capacity.ON_DEMAND, t)
        # 4. the policy
        if not latched:
            obs = Observation(
                now_s=float(t * gap),
                step_s=float(gap),
                work_left_s=P - p,
                work_total_s=P,
                started_s=0.0,
                deadline_s=deadline,
                restart_overhead_s=d,
                checkpoint_gb=job.checkpoint_gb,
                zones=tuple(
                    ZoneState(z.zone, z.region, float(z.spot_price[t]), z.on_demand_price, histories[i])
                    for i, z in enumerate(zones)
                ),
                running=None if inst is None else Running(
                    zones[inst.zone].zone, inst.capacity, O, inst.launched_tick * gap),
                last_zone=None if leader is None else zones[leader].zone,
                egress=egress,
            )
            decision = policy.decide(obs)
            if keep_timeline:
                result.decisions.append(decision)
            launching = decision.action is Action.LAUNCH
            all_failed = launching and not any(launch(index[o.zone], o.capacity, t) for o in decision.offers)
            if decision.action is Action.WAIT or (all_failed and decision.otherwise is Action.WAIT):
                stop_current()
            for zone in decision.probe:
                z = index[zone]
                if inst is not None and inst.zone == z and inst.capacity is Capacity.SPOT:
                    continue  # our own instance already tells us
                ok = available(z, t)
                histories[z].record(Event.PROBE_OK if ok else Event.PROBE_FAILED, t * gap)
                if ok:
                    probes_ok.append(z)
        if keep_timeline:
            result.timeline.append(Step(t, None if inst is None else inst.zone,
                                        None if inst is None else inst.capacity, p, preempted, latched))
        t += 1
    result.egress = egress_total
    result.cost = sum(billed) + egress_total
    return result
