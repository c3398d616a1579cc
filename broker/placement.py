"""Placement: the reconciler's side of the policy (`broker/policy/`).

For one job it builds what the policy observes from the database, asks the
same `SpotBroker.decide` the simulator measures, and turns the decision
into placements to try in order. What the policy sees:

* **zones**: every feasible offer of the job's shape with both a spot and an
  on-demand price, one policy zone per place and instance type, named
  `cloud/region/zone/instance-type` (cheapest spot first);
* **each zone's history**: every team's spot attempts there in the last
  `placement_history_days`, replayed in time order: a launch that came up,
  a capacity error, and how long the instance lived and how it ended (a
  preemption, or stopped by us). A zone's spot capacity is the same
  whichever team asks;
* **the job**: the work it needs (`estimated_hours`), the work done (each
  ended attempt's time up to its last committed checkpoint, plus the time of
  the attempt running now), its deadline, the restart overhead
  (`restart_overhead_seconds`), the newest checkpoint's size and where it
  was written, and what runs now.

Times are POSIX seconds, so one set of histories serves every job in a pass.
Probes the policy asks for are collected during a pass and carried out by
the reconciler at its end (`take_probes`): at most one per place per
`placement_interval`, through the launcher's `probe`; their results join the
histories (`spot_probes`).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from spotbroker.broker.models import Attempt, Checkpoint, Job, Offer, SpotProbe
from spotbroker.broker.offers import Placement, feasible_offers, placement_of
from spotbroker.broker.policy import Action, Capacity, Event, Observation, Running, SpotBroker, ZoneHistory, ZoneState
from spotbroker.broker.settings import Settings
from spotbroker.broker.spec import JobSpec
from spotbroker.broker.states import LIVE_ATTEMPT_STATES, AttemptState

A = AttemptState
POLICY = SpotBroker()
# A job that gives no estimate is expected to need as long again as it has
# run, and at least this long (without a deadline only the ratio of
# restarts to work matters, so a rough figure does).
UNKNOWN_WORK_S = 3600.0
# An estimate the job has outrun: this fraction of it is assumed to be left.
OUTRUN_LEFT = 0.1
ENDED_BY_RECLAIM = ("preempted", "vanished")
# The cheapest this many places (by spot price) are weighed: a decision stays
# well under a millisecond, and a place further down the list would need a
# far better record than any zone has to win.
MAX_ZONES = 20


def zone_key(cloud: str, region: str | None, zone: str | None, zone_id: str | None, instance_type: str | None) -> str:
    return f"{cloud}/{region or '*'}/{zone or zone_id or '*'}/{instance_type or '*'}"


def attempt_key(a: Attempt) -> str:
    return zone_key(a.cloud, a.region, a.zone, a.zone_id, a.instance_type)


def offer_key(o: Offer) -> str:
    return zone_key(o.cloud, o.region, o.zone, o.zone_id, o.instance_type)


@dataclass(frozen=True)
class Choice:
    """The policy's decision, in placements."""

    action: Action  # KEEP, WAIT, or LAUNCH `placements` in order
    placements: tuple[Placement, ...]
    otherwise: Action  # LAUNCH: what to do when every placement fails
    reason: str


def load_histories(session: Session, now: datetime, settings: Settings) -> dict[str, ZoneHistory]:
    """Every place's spot history from the attempts table."""
    since = now - timedelta(days=settings.placement_history_days)
    rows = session.execute(
        select(Attempt.cloud, Attempt.region, Attempt.zone, Attempt.zone_id, Attempt.instance_type,
               Attempt.state, Attempt.reason, Attempt.started_at, Attempt.ended_at)
        .where(Attempt.use_spot.is_(True), Attempt.created_at >= since)).all()
    samples: dict[str, list[tuple[float, int, Event, bool]]] = defaultdict(list)
    for r in rows:
        key = zone_key(r.cloud, r.region, r.zone, r.zone_id, r.instance_type)
        out = samples[key]
        ended = r.ended_at.timestamp() if r.ended_at else None
        if r.started_at is None:
            if r.state == A.FAILED and r.reason == "no_capacity" and ended is not None:
                out.append((ended, 0, Event.CAPACITY_FAILURE, False))
            continue
        out.append((r.started_at.timestamp(), 0, Event.LAUNCH_OK, False))
        # The instance was up from its start to its end (heartbeats say so).
        if r.state in LIVE_ATTEMPT_STATES or ended is None:
            out.append((now.timestamp(), 1, Event.RUNNING, True))
        elif r.state == A.PREEMPTED and r.reason in ENDED_BY_RECLAIM:
            out += [(ended, 1, Event.RUNNING, True), (ended, 2, Event.PREEMPTED, False)]
        else:
            out.append((ended, 1, Event.RUNNING, True))
    probes = session.execute(
        select(SpotProbe.cloud, SpotProbe.region, SpotProbe.zone, SpotProbe.zone_id, SpotProbe.instance_type,
               SpotProbe.available, SpotProbe.at).where(SpotProbe.at >= since)).all()
    for r in probes:
        key = zone_key(r.cloud, r.region, r.zone, r.zone_id, r.instance_type)
        samples[key].append((r.at.timestamp(), 0, Event.PROBE_OK if r.available else Event.PROBE_FAILED, False))
    join_s = 1.5 * settings.placement_interval
    histories = {}
    for key, events in samples.items():
        history = histories[key] = ZoneHistory(join_within_s=join_s)
        for at, _, event, seen in sorted(events, key=lambda e: (e[0], e[1])):
            history.record(event, at, seen_since_last=seen)
    return histories


class Placer:
    """Decides for one job at a time; the histories are loaded once per pass."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._egress = settings.egress_prices()
        self._histories: dict[str, ZoneHistory] | None = None
        self._probes: dict[str, Placement] = {}
        # per pass, by the job's resources: jobs of one shape share their offers
        self._offers: dict[str, tuple[list, dict]] = {}
        self._states: dict[str, list[ZoneState]] = {}

    def new_pass(self) -> None:
        self._histories = None
        self._offers, self._states = {}, {}

    def take_probes(self, now: datetime) -> list[Placement]:
        """The probes asked for during this pass, one per place, leaving out
        places sampled within the last half `placement_interval` (by any job):
        about one probe per place per interval, so that consecutive samples
        join into spells (`ZoneHistory.join_within_s`)."""
        recent = now.timestamp() - 0.5 * self.settings.placement_interval
        due = [p for key, p in self._probes.items()
               if (h := (self._histories or {}).get(key)) is None or (h.last_sample_s or -1e18) < recent]
        self._probes = {}
        return due

    def _candidates(self, session: Session, spec: JobSpec) -> tuple[list, dict]:
        """(feasible (offer, resource set) pairs, spot zones: key -> (offer, spot, on-demand))."""
        shape = spec.resources.model_dump_json()
        if shape not in self._offers:
            feasible = feasible_offers(session, spec)
            zones: dict[str, tuple] = {}
            for offer, want in feasible:
                if not want.use_spot:
                    continue
                spot, od = placement_of(offer, want, True), placement_of(offer, want, False)
                if spot is not None and od is not None:
                    zones.setdefault(offer_key(offer), (offer, spot, od))
            self._offers[shape] = (feasible, zones)
        return self._offers[shape]

    def choose(self, session: Session, job: Job, spec: JobSpec, now: datetime,
               running: Attempt | None = None) -> Choice | None:
        """What the job should do now; None when no offer can ever fit it.

        Resource sets that do not want spot (and jobs with no spot offer at all)
        are placed on the cheapest list price, as they ask.
        """
        feasible, zones = self._candidates(session, spec)
        if not feasible:
            return None
        if not zones:
            listed = [p for o, w in feasible if (p := placement_of(o, w, w.use_spot)) is not None]
            if not listed:
                return None
            listed.sort(key=lambda p: p.price_per_hour)
            return Choice(Action.LAUNCH, tuple(listed), Action.WAIT, "list price")
        obs = self._observe(session, job, spec, now, zones, running)
        decision = POLICY.decide(obs)
        wanted = []
        for o in decision.offers:
            if o.zone in zones:  # (not a restart where an instance runs whose offer is gone)
                _, spot, od = zones[o.zone]
                wanted.append(spot if o.capacity is Capacity.SPOT else od)
        for key in decision.probe:
            if key in zones:
                self._probes.setdefault(key, zones[key][1])
        action = decision.action
        if action is Action.LAUNCH and not wanted:
            action = decision.otherwise
        return Choice(action, tuple(wanted), decision.otherwise, decision.reason)

    def _observe(self, session: Session, job: Job, spec: JobSpec, now: datetime,
                 zones: dict[str, tuple], running: Attempt | None) -> Observation:
        if self._histories is None:
            self._histories = load_histories(session, now, self.settings)
        s = self.settings
        now_s = now.timestamp()
        join_s = 1.5 * s.placement_interval

        def state(key: str, region: str, spot_price: float, od_price: float) -> ZoneState:
            history = self._histories.get(key) or ZoneHistory(join_within_s=join_s)
            return ZoneState(key, region, spot_price, od_price, history)

        shape = spec.resources.model_dump_json()
        if shape not in self._states:
            self._states[shape] = sorted((state(key, offer.region, spot.price_per_hour, od.price_per_hour)
                                          for key, (offer, spot, od) in zones.items()),
                                         key=lambda z: (z.spot_price, z.zone))[:MAX_ZONES]
        states = list(self._states[shape])
        done = _work_done(session, job, now)
        total = spec.estimated_hours * 3600 if spec.estimated_hours else max(UNKNOWN_WORK_S, 2 * done)
        left = max(total - done, OUTRUN_LEFT * total)
        newest = session.scalar(select(Checkpoint).where(Checkpoint.job_id == job.id)
                                .order_by(Checkpoint.step.desc(), Checkpoint.id.desc()).limit(1))
        last_zone = None
        if newest is not None:
            last_zone = next((attempt_key(a) for a in job.attempts if a.id == newest.attempt_id), None)
        current = None
        if running is not None and running.started_at is not None:
            since = running.created_at.timestamp()
            current = Running(attempt_key(running), Capacity.SPOT if running.use_spot else Capacity.ON_DEMAND,
                              max(0.0, s.restart_overhead_seconds - (now_s - since)), since)
            if all(z.zone != current.zone for z in states):  # the policy weighs what runs now too
                if current.zone in zones:
                    offer, spot, od = zones[current.zone]
                    states.append(state(current.zone, offer.region, spot.price_per_hour, od.price_per_hour))
                else:  # its offer is gone from the catalog: judge it as it was bought
                    price = running.price_per_hour
                    states.append(state(current.zone, running.region or "*", price, price))
        return Observation(
            now_s=now_s, step_s=s.placement_interval, work_left_s=left, work_total_s=max(total, left),
            started_s=job.created_at.timestamp(),
            deadline_s=spec.deadline.timestamp() if spec.deadline else None,
            restart_overhead_s=s.restart_overhead_seconds,
            checkpoint_gb=newest.bytes / 1e9 if newest is not None else 0.0,
            zones=tuple(states), running=current, last_zone=last_zone, egress=self._egress)


def _work_done(session: Session, job: Job, now: datetime) -> float:
    """Seconds of the job's work kept: each ended attempt's run up to its last
    committed checkpoint, and all of the run of the attempt that is live."""
    last_commit = dict(session.execute(
        select(Checkpoint.attempt_id, func.max(Checkpoint.committed_at))
        .where(Checkpoint.job_id == job.id).group_by(Checkpoint.attempt_id)).all())
    done = 0.0
    for a in job.attempts:
        if a.started_at is None:
            continue
        end = now if a.state in LIVE_ATTEMPT_STATES else last_commit.get(a.id)
        if end is not None:
            done += max(0.0, (end - a.started_at).total_seconds())
    return done
