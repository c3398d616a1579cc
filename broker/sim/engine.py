"""The tick simulator of spot-sim-protocol §2: one job, one window, one policy.

Time moves in ticks of the trace's gap. At most one instance runs at a time.
Each tick t first closes interval t-1 (bill it, credit progress, apply a
preemption), then applies the environment's deadline safety net, then asks
the policy (through `broker.policy`'s interface, with only what has been
observed so far) and carries out its decision.
"""
from __future__ import annotations

import copy
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
    histories: list[ZoneHistory] | None = None,
) -> RunResult:
    """Simulate `policy` on `traces` (already cut to start at the window's first tick).

    `safety_net=False` and `bill_last_interval=True` are the single-zone UP arm's
    rules (§4, §2 "Reported cost"); every other arm uses the defaults.
    `histories`: what the zones' histories hold when the window starts (copied;
    samples before the window carry negative times), one per zone; None (the
    protocol's rule) starts every zone blank.
    """
    L = job.window_ticks(traces.gap_s)
    if traces.n_ticks < L + 1:
        raise TraceError(f"the window needs {L + 1} ticks of trace but only {traces.n_ticks} remain")
    run = _Window(traces, policy, job, L, egress or EgressPrices(), keep_timeline)
    if histories is not None:
        if len(histories) != len(run.histories):
            raise TraceError(f"{len(histories)} histories for {len(run.histories)} zones")
        run.histories = [copy.deepcopy(h) for h in histories]
    return run.run(safety_net, bill_last_interval)


class _Window:
    """One run of §2's tick loop; each method is one numbered step of a tick."""

    def __init__(self, traces: TraceSet, policy: Policy, job: Job, L: int, egress: EgressPrices,
                 keep_timeline: bool) -> None:
        self.policy, self.job, self.L, self.egress = policy, job, L, egress
        self.keep_timeline = keep_timeline
        self.gap = traces.gap_s
        self.zones = traces.zones
        self.index = {z.zone: i for i, z in enumerate(self.zones)}
        self.histories = [ZoneHistory(join_within_s=1.5 * self.gap) for _ in self.zones]
        self.p = 0.0  # progress
        self.O = 0.0  # restart overhead left
        self.leader: int | None = None
        self.inst: _Instance | None = None
        self.billed: list[float] = []  # cost of each closed interval
        self.egress_total = 0.0
        self.probes_ok: list[int] = []  # zones probed successfully in the current tick
        self.latched = False
        self.result = RunResult(0.0, False, None, 0.0, 0, 0, 0, 0)

    def available(self, z: int, t: int) -> bool:
        return t < self.L and not self.zones[z].unavailable[t]

    def price(self, z: int, cap: Capacity, t: int) -> float:
        return float(self.zones[z].spot_price[t]) if cap is Capacity.SPOT else self.zones[z].on_demand_price

    def launch(self, z: int, cap: Capacity, t: int) -> bool:
        if cap is Capacity.SPOT:
            ok = self.available(z, t)
            self.histories[z].record(Event.LAUNCH_OK if ok else Event.CAPACITY_FAILURE, t * self.gap)
            if not ok:
                return False
        self.stop_current()
        self.inst = _Instance(z, cap, t)
        self.result.launches += 1
        return True

    def stop_current(self) -> None:
        if self.inst is not None and self.inst.capacity is Capacity.SPOT:
            self.histories[self.inst.zone].spot_stopped()
        self.inst = None

    def run(self, safety_net: bool, bill_last_interval: bool) -> RunResult:
        t = 0
        while True:
            ran, preempted = self.close_interval(t) if t > 0 else (None, False)
            self.probes_ok = []
            if self.ended(t, ran, bill_last_interval):
                break
            if safety_net and not self.latched:
                self.apply_safety_net(t)
            if not self.latched:
                self.ask_policy(t)
            if self.keep_timeline:
                inst = self.inst
                self.result.timeline.append(Step(t, None if inst is None else inst.zone,
                                                 None if inst is None else inst.capacity, self.p, preempted,
                                                 self.latched))
            t += 1
        self.result.egress = self.egress_total
        self.result.cost = sum(self.billed) + self.egress_total
        return self.result

    def close_interval(self, t: int) -> tuple[_Instance | None, bool]:
        """1. Bill interval t-1, credit its progress, apply a preemption at t;
        (the instance that ran in t-1, whether it was reclaimed)."""
        ran, inst, zones, gap = self.inst, self.inst, self.zones, self.gap
        cost = sum(float(zones[z].spot_price[t - 1]) * PROBE_SECONDS / 3600 for z in self.probes_ok)
        if inst is not None:
            cost += self.price(inst.zone, inst.capacity, t - 1) * gap / 3600
            if inst.capacity is Capacity.SPOT:
                self.result.spot_ticks += 1
            else:
                self.result.on_demand_ticks += 1
            if inst.launched_tick == t - 1:
                self.O = self.job.restart_s
                if self.leader is not None and self.leader != inst.zone:
                    self.egress_total += self.egress.fee(zones[self.leader].zone, zones[inst.zone].zone,
                                                         self.job.checkpoint_gb)
            self.p += min(max(gap - self.O, 0.0), self.job.work_s - self.p)
            self.O = max(self.O - gap, 0.0)
            self.leader = inst.zone
        self.billed.append(cost)
        if inst is not None and inst.capacity is Capacity.SPOT:
            if self.available(inst.zone, t):
                self.histories[inst.zone].record(Event.RUNNING, t * gap)
            else:
                self.histories[inst.zone].record(Event.PREEMPTED, t * gap)
                self.result.preemptions += 1
                self.inst = None
                return ran, True
        return ran, False

    def ended(self, t: int, ran: _Instance | None, bill_last_interval: bool) -> bool:
        """2. Done (the work is complete) or failed (the deadline has passed)."""
        gap, result = self.gap, self.result
        if self.job.work_s - self.p <= DONE_EPS_S:
            if bill_last_interval:
                # UP: the completing interval is billed too, at the following tick's price
                if ran is not None and self.billed:
                    self.billed[-1] += (self.price(ran.zone, ran.capacity, t)
                                        - self.price(ran.zone, ran.capacity, t - 1)) * gap / 3600
            else:
                self.billed = self.billed[:-1]
            result.finish_s = t * gap
            result.deadline_met = t * gap <= self.job.deadline_s
            return True
        if t * gap >= self.job.deadline_s:
            result.deadline_met = False
            return True
        return False

    def apply_safety_net(self, t: int) -> None:
        """3. The environment's safety net: on-demand once the slack is gone."""
        gap, job, zones, leader = self.gap, self.job, self.zones, self.leader
        rem = job.work_s - self.p
        t_left = math.floor((job.deadline_s - t * gap) / gap) * gap
        need = math.ceil((rem + job.restart_s) / gap) * gap
        if need < t_left:
            return
        self.latched = True
        if self.inst is not None:
            if self.inst.capacity is Capacity.SPOT:
                self.launch(self.inst.zone, Capacity.ON_DEMAND, t)
            return
        best = min(
            range(len(zones)),
            key=lambda z: (
                zones[z].on_demand_price * rem / 3600
                + self.egress.fee(zones[leader].zone if leader is not None else None, zones[z].zone,
                                  job.checkpoint_gb),
                z,
            ),
        )
        self.launch(best, Capacity.ON_DEMAND, t)

    def ask_policy(self, t: int) -> None:
        """4. The policy, with what has been observed so far; carry out its decision."""
        gap, job, inst = self.gap, self.job, self.inst
        obs = Observation(
            now_s=float(t * gap),
            step_s=float(gap),
            work_left_s=job.work_s - self.p,
            work_total_s=job.work_s,
            started_s=0.0,
            deadline_s=job.deadline_s,
            restart_overhead_s=job.restart_s,
            checkpoint_gb=job.checkpoint_gb,
            zones=tuple(
                ZoneState(z.zone, z.region, float(z.spot_price[t]), z.on_demand_price, self.histories[i])
                for i, z in enumerate(self.zones)
            ),
            running=None if inst is None else Running(
                self.zones[inst.zone].zone, inst.capacity, self.O, inst.launched_tick * gap),
            last_zone=None if self.leader is None else self.zones[self.leader].zone,
            egress=self.egress,
        )
        decision = self.policy.decide(obs)
        if self.keep_timeline:
            self.result.decisions.append(decision)
        launching = decision.action is Action.LAUNCH
        all_failed = launching and not any(self.launch(self.index[o.zone], o.capacity, t) for o in decision.offers)
        if decision.action is Action.WAIT or (all_failed and decision.otherwise is Action.WAIT):
            self.stop_current()
        for zone in decision.probe:
            z = self.index[zone]
            if self.inst is not None and self.inst.zone == z and self.inst.capacity is Capacity.SPOT:
                continue  # our own instance already tells us
            ok = self.available(z, t)
            self.histories[z].record(Event.PROBE_OK if ok else Event.PROBE_FAILED, t * gap)
            if ok:
                self.probes_ok.append(z)
