"""The placement policy's interface: what it observes and what it decides.

Everything here is a plain dataclass with SI-ish units: seconds for time
(`now_s` is any monotonic clock, e.g. seconds since the job was submitted),
dollars per hour for prices, dollars for fees, GB for sizes. Nothing here
knows about the simulator or the database; both build an `Observation`,
call `Policy.decide`, and carry out the `Decision`.

How a caller drives a policy (the simulator does exactly this each tick,
the reconciler does it each pass for a job):

1. Record what happened since the last call into each zone's `ZoneHistory`
   (`record(...)`: launch results, probe results, a preemption, and one
   `RUNNING` heartbeat per pass for the zone a spot instance runs in).
2. Build an `Observation` (job progress, deadline, prices, histories, the
   current instance) and call `decide`.
3. Carry out the `Decision`:
   - `KEEP`: leave things as they are.
   - `WAIT`: stop the current instance (if any) and run nothing.
   - `LAUNCH`: try `offers` in order; the first launch that succeeds
     replaces the current instance (which is then terminated). An offer
     equal to the running instance is a *new* launch (a restart). If every
     offer fails (no spot capacity), do `otherwise` (KEEP or WAIT).
   Then probe the zones in `probe` (ask for spot capacity without running the
   job; a successful probe costs about a minute of spot).
   Record every result in the zones' histories before the next call.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from spotbroker.broker.placement.policy.egress import EgressPrices


class Capacity(str, Enum):
    SPOT = "spot"
    ON_DEMAND = "on_demand"


@dataclass(frozen=True)
class Offer:
    zone: str
    capacity: Capacity


class Action(str, Enum):
    KEEP = "keep"
    LAUNCH = "launch"
    WAIT = "wait"


@dataclass(frozen=True)
class Decision:
    action: Action
    offers: tuple[Offer, ...] = ()  # LAUNCH only: tried in this order
    otherwise: Action = Action.KEEP  # LAUNCH only: what to do when every offer fails
    probe: tuple[str, ...] = ()  # zones to probe for spot capacity
    reason: str = ""  # one short phrase for logs and plots

    @staticmethod
    def keep(reason: str = "", probe: tuple[str, ...] = ()) -> Decision:
        return Decision(Action.KEEP, probe=probe, reason=reason)

    @staticmethod
    def wait(reason: str = "", probe: tuple[str, ...] = ()) -> Decision:
        return Decision(Action.WAIT, probe=probe, reason=reason)

    @staticmethod
    def launch(*offers: Offer, otherwise: Action = Action.KEEP, reason: str = "",
               probe: tuple[str, ...] = ()) -> Decision:
        return Decision(Action.LAUNCH, tuple(offers), otherwise, probe, reason)


class Event(str, Enum):
    """What a caller tells a zone's history. Each one is also a sample of whether
    spot capacity was there at that moment."""

    LAUNCH_OK = "launch_ok"  # a spot launch succeeded (capacity: yes)
    CAPACITY_FAILURE = "capacity_failure"  # a spot launch failed for capacity (no)
    PROBE_OK = "probe_ok"  # yes
    PROBE_FAILED = "probe_failed"  # no
    RUNNING = "running"  # our spot instance is still up (yes); once per pass
    PREEMPTED = "preempted"  # our spot instance was reclaimed (no)


_AVAILABLE = {Event.LAUNCH_OK, Event.PROBE_OK, Event.RUNNING}


@dataclass
class ZoneHistory:
    """What the caller has seen of one zone's spot capacity, folded into counts
    as it arrives (so a decision costs O(zones), however long the history).

    Spot capacity is treated as an on/off process. Between two consecutive
    samples no more than `join_within_s` apart, the zone is assumed to have
    stayed in the first sample's state (a change is placed half-way), which
    gives the time seen up and down and the number of up→down and down→up
    changes: the estimators' inputs. Longer gaps count as unseen.
    """

    # Two samples further apart than this are not joined: what happened between
    # them was not seen (set it to about 1.5 times the caller's step).
    join_within_s: float = 900.0
    samples: int = 0
    launches_ok: int = 0
    capacity_failures: int = 0
    probes_ok: int = 0
    probes_failed: int = 0
    preemptions: int = 0
    seconds_up: float = 0.0  # time seen with spot capacity
    seconds_down: float = 0.0  # time seen without
    ups_lost: float = 0  # up → down changes seen (a preemption is one), weighted
    downs_ended: float = 0  # down → up changes seen, weighted
    last_sample_s: float | None = None
    last_available: bool | None = None
    state_since_s: float | None = None  # when the current state was first seen
    lifetimes_s: list[float] = field(default_factory=list)  # our spot runs that ended in a preemption
    up_spells_s: list[float] = field(default_factory=list)  # spells of capacity seen from start to end
    up_spell_weights: list[float] = field(default_factory=list)  # each spell's weight (1: seen by this job)
    up_start_seen: bool = False  # the current up spell was seen to begin (so its age is known)
    spot_run_started_s: float | None = None  # our current spot instance's launch time

    def record(self, event: Event, at_s: float, seen_since_last: bool = False, weight: float = 1.0) -> None:
        """Fold in one sample. `seen_since_last`: the caller knows the zone kept
        the previous sample's state until now, however long ago that was (the
        broker knows a spot instance was up from its launch to its end).
        `weight` < 1: evidence from before the job, faded by its age; the time
        and changes since the previous sample count that much."""
        available = event in _AVAILABLE
        if event is Event.LAUNCH_OK:
            self.launches_ok += 1
            self.spot_run_started_s = at_s
        elif event is Event.CAPACITY_FAILURE:
            self.capacity_failures += 1
        elif event is Event.PROBE_OK:
            self.probes_ok += 1
        elif event is Event.PROBE_FAILED:
            self.probes_failed += 1
        elif event is Event.PREEMPTED:
            self.preemptions += 1
            if self.spot_run_started_s is not None:
                self.lifetimes_s.append(at_s - self.spot_run_started_s)
            self.spot_run_started_s = None
        self._sample(available, at_s, seen_since_last, weight)

    def up_for_s(self, now_s: float) -> float | None:
        """How long spot has been seen up without a break (None: not seen up last)."""
        if not self.last_available or self.state_since_s is None:
            return None
        return now_s - self.state_since_s

    def spot_stopped(self) -> None:
        """Our spot instance here was stopped by us (not a preemption)."""
        self.spot_run_started_s = None

    def _sample(self, available: bool, at_s: float, seen_since_last: bool = False, weight: float = 1.0) -> None:
        self.samples += 1
        last = self.last_sample_s
        joined = last is not None and last <= at_s and (seen_since_last or at_s <= last + self.join_within_s)
        if joined:
            span = (at_s - last) * weight
            if available == self.last_available:
                if available:
                    self.seconds_up += span
                else:
                    self.seconds_down += span
            else:
                self.seconds_up += span / 2
                self.seconds_down += span / 2
                if available:
                    self.downs_ended += weight
                else:
                    self.ups_lost += weight
        if available != self.last_available:
            if self.last_available and self.up_start_seen and self.state_since_s is not None and joined:
                # an up spell seen to start and end: from its first sample to the first down one
                self.up_spells_s.append(at_s - self.state_since_s)
                self.up_spell_weights.append(weight)
            self.up_start_seen = available and self.last_available is False and joined
            self.state_since_s = at_s
        self.last_sample_s = at_s
        self.last_available = available


@dataclass(frozen=True)
class ZoneState:
    """One zone as the policy sees it now."""

    zone: str
    region: str
    spot_price: float  # $/h now
    on_demand_price: float  # $/h now
    history: ZoneHistory
    # Published interruption risk (fraction of spot VMs interrupted per month:
    # AWS advisor band, placement score, Azure eviction band); None where no
    # one publishes one (and in the traces). It sets the estimators' prior.
    risk: float | None = None


@dataclass(frozen=True)
class Running:
    """The instance the job runs on now."""

    zone: str
    capacity: Capacity
    overhead_left_s: float  # restart overhead still to pay before progress resumes
    since_s: float  # launch time


@dataclass(frozen=True)
class Observation:
    now_s: float  # the caller's clock
    step_s: float  # about how long until the policy is consulted again
    work_left_s: float  # productive seconds still needed
    work_total_s: float
    started_s: float  # when the job was submitted (same clock)
    deadline_s: float | None  # absolute, same clock; None = no deadline
    restart_overhead_s: float  # lost after every launch before progress resumes
    checkpoint_gb: float
    zones: tuple[ZoneState, ...]  # in preference order (ties go to the first)
    running: Running | None
    last_zone: str | None  # where the checkpoint is (the zone that ran last)
    egress: EgressPrices = field(default_factory=EgressPrices)


class Policy(Protocol):
    """A placement policy. `decide` must not mutate the observation."""

    name: str

    def decide(self, obs: Observation) -> Decision: ...
