"""Each place's spot history, replayed from the attempts table and the
probes (what the placer's policy learns spells from), and the key that
names a place (`cloud/region/zone/instance-type`); the probes' answers
are recorded here too (`record_probes`)."""
from __future__ import annotations

import logging
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.jobs.states import LIVE_ATTEMPT_STATES, RECLAIMED, EndReason, team_could_cause
from spotbroker.broker.placement.policy import Event, ZoneHistory
from spotbroker.broker.placement.policy.fading import FadingHistory
from spotbroker.broker.settings import Settings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Job, Offer, SpotProbe

log = logging.getLogger("spotbroker.broker.reconciler")  # where a failed probe was always told


def zone_key(cloud: str, region: str | None, zone: str | None, zone_id: str | None, instance_type: str | None) -> str:
    return f"{cloud}/{region or '*'}/{zone or zone_id or '*'}/{instance_type or '*'}"


def attempt_key(a: Attempt) -> str:
    return zone_key(a.cloud, a.region, a.zone, a.zone_id, a.instance_type)


def offer_key(o: Offer) -> str:
    return zone_key(o.cloud, o.region, o.zone, o.zone_id, o.instance_type)



def load_histories(session: Session, now: datetime, settings: Settings) -> dict[str, ZoneHistory]:
    """Every place's spot history as every team sees it, unfaded (`load_place_histories`)."""
    return {key: h.full for key, h in load_place_histories(session, now, settings).shared.items()}


Run = tuple[float, float, bool, int]  # (start, end, reclaimed, its team's id if only that team's reclaim, else 0)


class PlaceHistories:
    """Each place's history for a pass: `shared` as every team sees it, and a
    team's own (`of`) where it had reclaims it could have caused itself
    (`states.team_could_cause`): they count for it, not for the others."""

    def __init__(self, settings: Settings, now: datetime, runs: dict[str, list[Run]],
                 points: dict[str, list[tuple[float, Event]]]) -> None:
        self._settings, self._now, self._runs, self._points = settings, now, runs, points
        self.shared = {key: self._replayed(key, None) for key in runs.keys() | points.keys()}
        self._owned = {(team, key) for key, rs in runs.items() for *_, team in rs if team}
        self._own: dict[tuple[int, str], FadingHistory] = {}

    def _replayed(self, key: str, team: int | None) -> FadingHistory:
        history = place_history(self._settings, self._now)
        runs = [(start, end, reclaimed or by == team) for start, end, reclaimed, by in self._runs.get(key, [])]
        for at, rank, event in _samples(runs, self._points.get(key, [])):
            history.record(event, at, seen_since_last=rank == 1)
        return history

    def of(self, team: int, key: str) -> FadingHistory:
        """The place's history as `team` sees it (made for the pass if missing)."""
        if (team, key) in self._owned:
            if (team, key) not in self._own:
                self._own[team, key] = self._replayed(key, team)
            return self._own[team, key]
        history = self.shared.get(key)
        if history is None:
            history = self.shared[key] = place_history(self._settings, self._now)
        return history

    def record(self, key: str, event: Event, at: float) -> None:
        """What the pass learns of a place, in every team's view of it."""
        for history in [self.shared.get(key), *(h for (_, k), h in self._own.items() if k == key)]:
            if history is not None:
                history.record(event, at)


def load_place_histories(session: Session, now: datetime, settings: Settings) -> PlaceHistories:
    """Every place's spot history from the attempts table and the probes,
    each job reading what came before its start faded
    (`placement_memory_half_life_hours`; `policy/fading.py`).

    While any of our spot instances ran in a place, the place had capacity:
    the union of their runs is "up", and a refusal, a probe or another
    instance's reclaim inside it says nothing more. A stretch of that union
    ends in a reclaim when the run that ends it was reclaimed (or, still
    live, has had a preemption notice); a reclaim its team could have caused
    ends it for that team only. Outside the union, refusals and probes are
    the samples. Everything comes from the database, so a broker restarted
    at any point reads what a live one would.
    """
    since = now - timedelta(days=settings.placement_history_days)
    rows = session.execute(
        select(Attempt.cloud, Attempt.region, Attempt.zone, Attempt.zone_id, Attempt.instance_type,
               Attempt.state, Attempt.end_reason, Attempt.started_at, Attempt.ended_at,
               Attempt.preemption_requested, Job.team_id)
        .join(Job, Job.id == Attempt.job_id)
        .where(Attempt.use_spot.is_(True), or_(Attempt.ended_at.is_(None), Attempt.ended_at >= since))).all()
    runs: dict[str, list[Run]] = defaultdict(list)
    points: dict[str, list[tuple[float, Event]]] = defaultdict(list)
    for r in rows:
        key = zone_key(r.cloud, r.region, r.zone, r.zone_id, r.instance_type)
        if r.started_at is not None:
            live = r.state in LIVE_ATTEMPT_STATES or r.ended_at is None
            end = now if live else r.ended_at
            # a live attempt already ending PREEMPTED has had its notice: the zone is
            # being reclaimed now, for every job placed before its flush ends it
            reclaimed = r.end_reason in RECLAIMED
            own = reclaimed and team_could_cause(r.end_reason, r.preemption_requested)
            runs[key].append((r.started_at.timestamp(), end.timestamp(), reclaimed and not own,
                              r.team_id if own else 0))
        elif r.end_reason == EndReason.NO_CAPACITY and r.ended_at is not None:
            points[key].append((r.ended_at.timestamp(), Event.CAPACITY_FAILURE))
    probes = session.execute(
        select(SpotProbe.cloud, SpotProbe.region, SpotProbe.zone, SpotProbe.zone_id, SpotProbe.instance_type,
               SpotProbe.available, SpotProbe.at).where(SpotProbe.at >= since)).all()
    for r in probes:
        key = zone_key(r.cloud, r.region, r.zone, r.zone_id, r.instance_type)
        points[key].append((r.at.timestamp(), Event.PROBE_OK if r.available else Event.PROBE_FAILED))
    return PlaceHistories(settings, now, runs, points)


def place_history(settings: Settings, now: datetime) -> FadingHistory:
    """An empty history of a place for the pass at `now`."""
    return FadingHistory(1.5 * settings.placement_interval, settings.placement_memory_half_life_hours * 3600,
                         now.timestamp())


def _samples(runs: list[tuple[float, float, bool]], points: list[tuple[float, Event]]):
    """(time, rank, event) in order: each stretch of overlapping runs as a launch
    (rank 0), up until its end (rank 1), then maybe a reclaim (rank 2); and
    the points that fall outside every stretch."""
    stretches: list[list] = []  # [start, end, reclaimed]: disjoint, in order
    for start, end, reclaimed in sorted(runs):
        if stretches and start <= stretches[-1][1]:
            if end >= stretches[-1][1]:
                stretches[-1][1:] = [end, reclaimed]
        else:
            stretches.append([start, end, reclaimed])
    starts = [st[0] for st in stretches]

    def inside(at: float) -> bool:
        i = bisect_right(starts, at) - 1
        return i >= 0 and at <= stretches[i][1]

    out = [(at, 0, event) for at, event in points if not inside(at)]
    for start, end, reclaimed in stretches:
        out += [(start, 0, Event.LAUNCH_OK), (end, 1, Event.RUNNING)]
        if reclaimed:
            out.append((end, 2, Event.PREEMPTED))
    return sorted(out, key=lambda e: (e[0], e[1]))


def record_probes(factory: sessionmaker[Session], placements: Iterable, probe_for: Callable,
                  now: Callable[[], datetime]) -> None:
    """Ask each placement's launcher's `probe` (`probe_for(p)`, None: not
    asked) whether spot capacity is there now, and store each answer in
    `spot_probes`, which the zone's history replays."""
    rows = []
    for p in placements:
        probe = probe_for(p)
        if probe is None:
            continue
        try:
            available = bool(probe(p))
        except Exception as exc:  # a probe is advice: never let it stop a pass
            log.warning("probing %s failed: %s", p.place, exc)
            continue
        rows.append(SpotProbe(cloud=p.cloud, region=p.region, zone=p.zone, zone_id=p.zone_id,
                              instance_type=p.instance_type, available=available, at=now()))
    if rows:
        with transaction(factory) as session:
            session.add_all(rows)
