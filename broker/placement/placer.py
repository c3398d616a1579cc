"""Placement: the reconciler's side of the policy (`broker/placement/policy/`).

For one job it builds what the policy observes from the database, asks the
same `SpotBroker.decide` the simulator measures, and turns the decision
into placements to try in order. What the policy sees:

* **zones**: the feasible offers of the job's shape with both a spot and an
  on-demand price (the cheapest by spot price, the cheapest on-demand, and
  where it runs now), one policy zone per place and instance type, named
  `cloud/region/zone/instance-type` (cheapest spot first);
* **each zone's prices**, plus what the node's expected emissions are
  worth at the job's `carbon_price_per_tonne` (`carbon.py`; the placements
  launched keep their dollar prices);
* **each zone's history** (`histories.py`): every team's spot attempts there in the last
  `placement_history_days`, replayed in time order: a launch that came up,
  a capacity error, and how long the instance lived and how it ended (a
  preemption, or stopped by us). A zone's spot capacity is the same
  whichever team asks. What was seen before the job was submitted weighs
  half as much every `placement_memory_half_life_hours` of its age then;
  what was seen since, in full (`policy/fading.py`);
* **the job**: the work it needs (`estimated_hours`), the work done (each
  ended attempt's time up to its last committed checkpoint, plus the time of
  the attempt running now), its deadline, the restart overhead
  (`restart_overhead_seconds`), the newest checkpoint's size and where it
  was written, and what runs now.

Times are POSIX seconds, so one set of histories, replayed once a pass,
serves every job in it.
Probes the policy asks for are collected during a pass and carried out by
the reconciler at its end (`take_probes`): at most one per place per
`placement_interval`, through the launcher's `probe`; their results join the
histories (`spot_probes`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from spotbroker.broker.checkpoints.records import newest_checkpoint
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.jobs.states import LIVE_ATTEMPT_STATES, AttemptState
from spotbroker.broker.placement import carbon
from spotbroker.broker.placement.histories import (  # noqa: F401
    PlaceHistories,
    attempt_key,
    load_histories,
    load_place_histories,
    offer_key,
    place_history,
    zone_key,
)
from spotbroker.broker.placement.kubernetes import KubernetesPlaces
from spotbroker.broker.placement.policy import (
    Action,
    Capacity,
    Event,
    Observation,
    Running,
    SpotBroker,
    ZoneHistory,
    ZoneState,
)
from spotbroker.broker.placement.policy.egress import EgressPrices
from spotbroker.broker.pricing.offers import OFFER_COLUMNS, Placement, cheapest, groups_of, placement_of, priced
from spotbroker.broker.settings import Settings
from spotbroker.broker.store.models import Attempt, Checkpoint, Job, PriceOffer

A = AttemptState
POLICY = SpotBroker()
# The zones weighed for a shape are chosen by price alone, once a pass; each
# job's decision then gets each place's history as of its own start.
NO_HISTORY = ZoneHistory()
# A job that gives no estimate is expected to need as long again as it has
# run, and at least this long (without a deadline only the ratio of
# restarts to work matters, so a rough figure does).
UNKNOWN_WORK_S = 3600.0
# An estimate the job has outrun: this fraction of it is assumed to be left.
OUTRUN_LEFT = 0.1
# The cheapest this many places (by spot price) are weighed: a decision stays
# well under a millisecond, and a place further down the list would need a
# far better record than any zone has to win.
MAX_ZONES = 20


@dataclass(frozen=True)
class Choice:
    """The policy's decision, in placements."""

    action: Action  # KEEP, WAIT, or LAUNCH `placements` in order (then wait when all refuse)
    placements: tuple[Placement, ...]
    reason: str


NO_CLOUD = ("SkyPilot's `sky check` enabled no cloud: give its API server a cloud's credentials; the broker "
            "checks again every SPOTBROKER_SKYPILOT_CHECK_INTERVAL and releases the job once one is enabled")


NOT_CHECKED = ("waiting for SkyPilot's first `sky check` (which clouds it can launch on is not known yet): "
               "placed once it answers")


def enabled_clouds(launchers: dict) -> frozenset[str] | None:
    """The clouds the cloud launcher can reach (SkyPilot's `sky check`, as it
    last cached it), or None: no limit (the local launcher simulates every
    cloud; SkyPilot's answer not known yet)."""
    launcher = launchers.get("skypilot")
    ask = getattr(launcher, "enabled_clouds", None)
    return ask() if ask is not None else None


def egress_prices(settings: Settings) -> EgressPrices:
    """The operator's egress table (`SPOTBROKER_EGRESS_USD_PER_GB`) as the policy takes it."""
    table = dict(settings.egress_usd_per_gb)
    default = table.pop("default", EgressPrices().default_usd_per_gb)
    pairs = {frozenset(r.strip() for r in key.split(",")): price for key, price in table.items()}
    return EgressPrices(default_usd_per_gb=default, pairs=pairs)


class Placer:
    """Decides for one job at a time; the histories are loaded once per pass."""

    def __init__(self, settings: Settings, launchers: dict | None = None) -> None:
        self.settings = settings
        # Shared with the reconciler (a launcher may join it after start-up):
        # a launcher that knows which clouds it can reach limits the offers.
        self._launchers = launchers if launchers is not None else {}
        self._clouds: frozenset[str] | None = None
        self._egress = egress_prices(settings)
        self._histories: PlaceHistories | None = None
        self._probes: dict[str, Placement] = {}
        # per pass, by the job's resources: jobs of one shape share their offers
        self._offers: dict[str, tuple[list, dict, list]] = {}
        self._states: dict[tuple[str, float], list[ZoneState]] = {}  # by shape and carbon price
        self._emissions = carbon.Emissions()
        # The operator's Kubernetes clusters, offered beside the clouds (None: none configured).
        self.kubernetes = KubernetesPlaces.from_settings(settings)

    def new_pass(self) -> None:
        self._histories = None
        self._offers, self._states, self._emissions = {}, {}, carbon.Emissions()
        self._clouds = enabled_clouds(self._launchers)

    def take_probes(self, now: datetime) -> list[Placement]:
        """The probes asked for during this pass, one per place, leaving out
        places sampled within the last half `placement_interval` (by any job):
        about one probe per place per interval, so that consecutive samples
        join into spells (`ZoneHistory.join_within_s`)."""
        recent = now.timestamp() - 0.5 * self.settings.placement_interval
        due = [p for key, p in self._probes.items()
               if (h := (self._histories.shared if self._histories else {}).get(key)) is None
               or (h.full.last_sample_s or -1e18) < recent]
        self._probes = {}
        return due

    def _candidates(self, session: Session, spec: JobSpec, shape: str,
                    running: Attempt | None = None) -> tuple[list[Placement], dict]:
        """(list-price placements, cheapest first; spot zones: key -> (offer, spot, on-demand)),
        shared by the jobs of one `shape` (their resources) for the pass.

        Only what a decision can use is loaded: per resource set, the zones
        whose spot price is among the 2 x MAX_ZONES cheapest (the policy weighs
        MAX_ZONES; the margin covers places listed twice), the cheapest
        on-demand zone (the deadline's safety net), and the zone `running`
        runs in. The list-price placements (used when no zone has both
        prices) are the cheapest a launch round could try.
        """
        if shape not in self._offers:
            groups = groups_of(session, spec)
            if self._clouds is not None:  # only where the cloud launcher can launch
                groups = [(want, [*where, PriceOffer.cloud.in_(sorted(self._clouds))]) for want, where in groups]
            zones: dict[str, tuple] = {}
            for want, where in groups:
                if want.use_spot:
                    both = priced(where, want, spot=True, ondemand=True)
                    rows = cheapest(session, both, PriceOffer.spot_price, 2 * MAX_ZONES, (PriceOffer.ondemand_price, 1))
                    self._add_zones(zones, rows, want)
            listed: list[Placement] = []
            if not zones:
                k = max(MAX_ZONES, self.settings.launch_failover_limit)
                for want, where in groups:
                    price = PriceOffer.spot_price if want.use_spot else PriceOffer.ondemand_price
                    rows = cheapest(session, priced(where, want, spot=want.use_spot, ondemand=not want.use_spot),
                                    price, k)
                    listed += [p for o in rows if (p := placement_of(o, want, want.use_spot)) is not None]
                listed.sort(key=lambda p: p.price_per_hour)
            self._offers[shape] = (listed, zones, groups)
        listed, zones, groups = self._offers[shape]
        if running is not None and zones and attempt_key(running) not in zones:
            self._add_running_zone(session, zones, groups, running)
        return listed, zones

    @staticmethod
    def _add_zones(zones: dict[str, tuple], offers, want) -> None:
        for offer in offers:
            spot, od = placement_of(offer, want, True), placement_of(offer, want, False)
            if spot is not None and od is not None:
                zones.setdefault(offer_key(offer), (offer, spot, od))

    def _add_running_zone(self, session: Session, zones: dict[str, tuple], groups: list, running: Attempt) -> None:
        """The zone a running attempt is in, when it is beyond the cheapest
        loaded: the policy weighs what runs now too."""
        here = [PriceOffer.cloud == running.cloud, PriceOffer.region == running.region,
                PriceOffer.instance_type == running.instance_type,
                PriceOffer.zone == running.zone if running.zone
                else (PriceOffer.zone.is_(None) & (PriceOffer.zone_id == running.zone_id))]
        for want, where in groups:
            if want.use_spot:
                rows = session.execute(select(*OFFER_COLUMNS).where(
                    *priced(where, want, spot=True, ondemand=True), *here).order_by(PriceOffer.id)).all()
                self._add_zones(zones, rows, want)

    def choose(self, session: Session, job: Job, spec: JobSpec, now: datetime,
               running: Attempt | None = None) -> Choice | None:
        """What the job should do now; None when no place can ever fit it.

        The clouds' decision (`choose_cloud`), with the operator's Kubernetes
        clusters merged in by price when the job is to be placed (a running
        job's moves stay among the clouds): broker/placement/kubernetes.py.
        """
        choice = self.choose_cloud(session, job, spec, now, running)
        if self.kubernetes is None or running is not None:
            return choice
        merged = self.kubernetes.merge(session, job, spec, now, choice, self._clouds,
                                       lambda: self._cloud_floor(spec))
        return Choice(*merged) if merged is not None else None

    def has_room(self, session: Session, placement: Placement, num_nodes: int, now: datetime) -> bool:
        """Whether a place chosen earlier in a launch round can still take the
        job (a Kubernetes cluster may have filled meanwhile; a cloud place is
        for the cloud to refuse)."""
        if self.kubernetes is None or placement.cloud != "k8s":
            return True
        return self.kubernetes.has_room(session, placement, num_nodes, now)

    def _cloud_floor(self, spec: JobSpec) -> float | None:
        """The cheapest cloud price per node-hour this pass knows for the job's
        shape (spot where it has both prices), or None."""
        listed, zones, _ = self._offers.get(spec.resources.model_dump_json(), ([], {}, []))
        prices = [spot.price_per_hour for _, spot, _ in zones.values()] or [p.price_per_hour for p in listed]
        return min(prices, default=None)

    def choose_cloud(self, session: Session, job: Job, spec: JobSpec, now: datetime,
                     running: Attempt | None = None) -> Choice | None:
        """What the job should do now among the clouds' offers; None when no offer can ever fit it.

        Resource sets that do not want spot (and jobs with no spot offer at all)
        are placed on the cheapest list price, as they ask.
        """
        shape = spec.resources.model_dump_json()
        listed, zones = self._candidates(session, spec, shape, running)
        price = spec.carbon_price_per_tonne or 0.0
        if not zones:
            return self._listed(session, now, spec, listed, price) if listed else None
        obs = self._observe(session, job, spec, shape, now, zones, running, price)
        decision = POLICY.decide(obs)
        why = decision.reason
        if price > 0:  # what dollars alone would have chosen: did carbon decide it?
            plain = POLICY.decide(replace(obs, zones=self._zone_states(session, now, job, shape, zones, running,
                                                                       obs.running, 0.0)))
            told = carbon.reason(price, decision, plain, lambda o: _placement(zones, o),
                                 lambda p: self._emissions.kg_per_hour(session, now, p), spec.num_nodes)
            why = f"{why}; {told}" if told else why
        wanted = [p for o in decision.offers if (p := _placement(zones, o)) is not None]
        for key in decision.probe:
            if key in zones:
                self._probes.setdefault(key, zones[key][1])
        action = decision.action
        if action is Action.LAUNCH and not wanted:
            if any(o.capacity is Capacity.ON_DEMAND for o in decision.offers):
                # on-demand where the running instance's offer is gone: the deadline's safety net
                # must not turn into "keep"; the cheapest on-demand there is stands in
                wanted = [min((od for _, _, od in zones.values()), key=lambda p: p.price_per_hour)]
            else:
                action = decision.otherwise
        return Choice(action, tuple(wanted), why)

    def _listed(self, session: Session, now: datetime, spec: JobSpec, listed: list[Placement],
                price: float) -> Choice:
        """The list-price placements, cheapest first in dollars plus the carbon price's worth."""
        if price <= 0:
            return Choice(Action.LAUNCH, tuple(listed), "list price")
        kg = {p: self._emissions.kg_per_hour(session, now, p) for p in listed}
        weighed = sorted(listed, key=lambda p: p.price_per_hour + carbon.surcharge(price, kg[p]))
        why = "list price"
        if weighed[0] != listed[0]:
            why += "; " + carbon.compared(price, weighed[0], listed[0], kg[weighed[0]], kg[listed[0]], spec.num_nodes)
        return Choice(Action.LAUNCH, tuple(weighed), why)

    def capacity_error(self, attempt: Attempt, at: datetime) -> None:
        """A launch refused for capacity: the jobs placed later in this pass know it."""
        if self._histories is not None and attempt.use_spot:
            self._histories.record(attempt_key(attempt), Event.CAPACITY_FAILURE, at.timestamp())

    def _observe(self, session: Session, job: Job, spec: JobSpec, shape: str, now: datetime,
                 zones: dict[str, tuple], running: Attempt | None, carbon_price: float = 0.0) -> Observation:
        if self._histories is None:
            self._histories = load_place_histories(session, now, self.settings)
        s = self.settings
        now_s = now.timestamp()
        done = _work_done(session, job, now, s.restart_overhead_seconds)
        total = spec.estimated_hours * 3600 if spec.estimated_hours else max(UNKNOWN_WORK_S, 2 * done)
        left = max(total - done, OUTRUN_LEFT * total)
        newest = newest_checkpoint(session, job.id)
        last_zone = None
        if newest is not None:
            last_zone = next((attempt_key(a) for a in job.attempts if a.id == newest.attempt_id), None)
        current = None
        if running is not None and running.started_at is not None:
            since = running.created_at.timestamp()
            current = Running(attempt_key(running), Capacity.SPOT if running.use_spot else Capacity.ON_DEMAND,
                              max(0.0, s.restart_overhead_seconds - (now_s - since)), since)
        return Observation(
            now_s=now_s, step_s=s.placement_interval, work_left_s=left, work_total_s=total,
            started_s=job.created_at.timestamp(),
            deadline_s=spec.deadline.timestamp() - s.deadline_margin_seconds if spec.deadline else None,
            restart_overhead_s=s.restart_overhead_seconds,
            checkpoint_gb=newest.bytes / 1e9 if newest is not None else 0.0,
            zones=self._zone_states(session, now, job, shape, zones, running, current, carbon_price),
            running=current, last_zone=last_zone, egress=self._egress)

    def _zone_states(self, session: Session, now: datetime, job: Job, shape: str, zones: dict[str, tuple],
                     running: Attempt | None, current: Running | None, carbon_price: float) -> tuple[ZoneState, ...]:
        """The zones as the policy sees them: each price plus what the node's
        expected emissions are worth at the job's carbon price (carbon.py),
        and each place's history as of the job's start (`policy/fading.py`)."""
        start_s = job.created_at.timestamp()

        def state(key: str, region: str, spot_price: float, od_price: float, risk: float | None = None,
                  kg: float = 0.0) -> ZoneState:
            extra = carbon.surcharge(carbon_price, kg)
            return ZoneState(key, region, spot_price + extra, od_price + extra, NO_HISTORY, risk)

        def of(key: str) -> ZoneState:
            offer, spot, od = zones[key]
            kg = (self._emissions.kg_per_hour(session, now, spot, (offer.vcpus, offer.memory_gib))
                  if carbon_price > 0 else 0.0)
            return state(key, offer.region, spot.price_per_hour, od.price_per_hour, offer.risk, kg)

        if (shape, carbon_price) not in self._states:  # by price alone: the same for every job of the shape
            self._states[shape, carbon_price] = sorted(map(of, zones), key=lambda z: (z.spot_price, z.zone))[:MAX_ZONES]
        states = list(self._states[shape, carbon_price])
        if current is not None and all(z.zone != current.zone for z in states):  # the policy weighs what runs now too
            if current.zone in zones:
                states.append(of(current.zone))
            else:  # its offer is gone from the catalog: judge it as it was bought, never as on-demand
                kg = (running.power_kw or 0.0) * (running.grid_g_per_kwh or 0.0) / 1000
                states.append(state(current.zone, running.region or "*", running.price_per_hour, math.inf, kg=kg))
        # one history per place for the pass (a team's own where it caused reclaims): what is learnt
        # during the pass reaches every job
        return tuple(replace(z, history=self._histories.of(job.team_id, z.zone).as_of(start_s)) for z in states)


def _placement(zones: dict[str, tuple], offer) -> Placement | None:
    """A policy offer's placement (None: not a restart where an instance runs whose offer is gone)."""
    if offer.zone not in zones:
        return None
    _, spot, od = zones[offer.zone]
    return spot if offer.capacity is Capacity.SPOT else od


def _work_done(session: Session, job: Job, now: datetime, restart_s: float) -> float:
    """Seconds of the job's work kept: each ended attempt's productive run (from
    its launch plus the restart overhead, or from when its node came up if
    later) up to its last checkpoint committed before it ended (a flush that
    came after is not what the next attempt resumed from), and the live
    attempt's up to now."""
    last_commit = dict(session.execute(
        select(Checkpoint.attempt_id, func.max(Checkpoint.committed_at))
        .join(Attempt, Attempt.id == Checkpoint.attempt_id)
        .where(Checkpoint.job_id == job.id,
               or_(Attempt.ended_at.is_(None), Checkpoint.committed_at <= Attempt.ended_at))
        .group_by(Checkpoint.attempt_id)).all())
    done = 0.0
    for a in job.attempts:
        if a.started_at is None:
            continue
        begin = max(a.started_at, a.created_at + timedelta(seconds=restart_s))
        end = now if a.state in LIVE_ATTEMPT_STATES else last_commit.get(a.id)
        if end is not None:
            done += max(0.0, (end - begin).total_seconds())
    return done
