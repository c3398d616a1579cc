"""The checkpoint interval each attempt is told, and why: the database side of
:mod:`spotbroker.broker.recovery.interval`.

The job's spec decides who sets it (`checkpoint.interval`, see
broker/jobs/checkpointspec.py): `code` leaves the trainer's own; a number
is that; `auto` (the default) is √(2·C·MTBF) for the zone the attempt runs
in, where

* the zone's MTBF comes from every team's spot attempts there in the last
  `placement_history_days` (their running time, and how many were
  reclaimed: `preempted` or `vanished`, never a move; a reclaim a team could
  have caused, counted for that team only), on a prior from the
  bundled traces scaled by the zone's published risk (the offer's `risk`);
* C is the job's measured checkpoint cost: the median time of its newest
  periodic checkpoints, from the step boundary to the commit (the stall plus
  the persist time the library reports in `checkpoint_committed.seconds`),
  whichever attempt made them; until one is measured, an assumed cost.

It is fitted when the attempt's agent first speaks (the start), again after
each periodic commit (C changes) and every `refresh_s` while the attempt
runs (the zone's record changes), and a new attempt (a move) gets its own.
The value in force changes, with a `checkpoint_interval` event on the job,
only when it moves by more than a tenth: the agent hands it to the library
with each answer (`checkpoint_interval_s`).
"""
from __future__ import annotations

import statistics
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from spotbroker.agent import protocol
from spotbroker.broker.jobs.checkpointspec import AUTO, CODE
from spotbroker.broker.jobs.states import LIVE_ATTEMPT_STATES, RECLAIMED, team_could_cause
from spotbroker.broker.recovery import interval as fit
from spotbroker.broker.store.models import Attempt, Checkpoint, Event, Job, PriceOffer

INTERVAL_EVENT = "checkpoint_interval"  # the broker's event: the interval in force changed
COST_SAMPLES = 5  # the newest periodic checkpoints whose median is C


def _same(column: Any, value: Any) -> Any:
    return column.is_(None) if value is None else column == value


def zone_name(a: Attempt) -> str:
    return f"{a.cloud}/{a.region or '*'}/{a.zone or a.zone_id or '*'}/{a.instance_type or '*'}"


def zone_record(session: Session, attempt: Attempt, now: datetime, history_days: float,
                team_id: int | None = None) -> fit.ZoneRecord:
    """Every team's spot instances of the attempt's zone and type, recent or
    running; a reclaim a team could have caused counts for `team_id`'s only."""
    since = now - timedelta(days=history_days)
    place = _same(Attempt.zone, attempt.zone) if attempt.zone else \
        (Attempt.zone.is_(None) & _same(Attempt.zone_id, attempt.zone_id))
    rows = session.execute(select(Attempt.started_at, Attempt.ended_at, Attempt.end_reason,
                                  Attempt.preemption_requested, Job.team_id).join(Job, Job.id == Attempt.job_id).where(
        Attempt.use_spot.is_(True), Attempt.cloud == attempt.cloud, _same(Attempt.region, attempt.region), place,
        _same(Attempt.instance_type, attempt.instance_type), Attempt.started_at.is_not(None),
        or_(Attempt.ended_at.is_(None), Attempt.ended_at >= since))).all()
    exposure = sum(max(0.0, ((r.ended_at or now) - r.started_at).total_seconds()) for r in rows)
    reclaims = sum(1 for r in rows if r.ended_at is not None and r.end_reason in RECLAIMED
                   and (r.team_id == team_id or not team_could_cause(r.end_reason, r.preemption_requested)))
    risk = session.scalar(select(PriceOffer.risk).where(
        PriceOffer.cloud == attempt.cloud, PriceOffer.region == (attempt.region or ""),
        PriceOffer.place == (attempt.zone or attempt.zone_id or ""),
        PriceOffer.instance_type == (attempt.instance_type or ""), PriceOffer.risk.is_not(None)).limit(1))
    return fit.ZoneRecord(exposure, reclaims, risk)


def measured_cost(session: Session, job_id: int) -> tuple[float | None, int]:
    """(median seconds of the job's newest periodic checkpoints, how many), or (None, 0)."""
    seconds = list(session.scalars(select(Checkpoint.seconds).where(
        Checkpoint.job_id == job_id, Checkpoint.reason == "periodic", Checkpoint.seconds.is_not(None))
        .order_by(Checkpoint.id.desc()).limit(COST_SAMPLES)))
    return (statistics.median(seconds), len(seconds)) if seconds else (None, 0)


def mode_of(job: Job) -> tuple[str, float | None]:
    """('auto' | 'code' | 'fixed', the fixed seconds) from the stored spec."""
    value = ((job.spec or {}).get("checkpoint") or {}).get("interval", AUTO)
    if value in (AUTO, CODE):
        return value, None
    return "fixed", float(value)


def fitted(session: Session, job: Job, attempt: Attempt, now: datetime, history_days: float) -> dict[str, Any]:
    """The interval for the attempt now, and why."""
    mode, fixed = mode_of(job)
    if mode == CODE:
        return {"seconds": None, "mode": mode, "why": "the trainer's own every_seconds (checkpoint.interval: code)"}
    if mode == "fixed":
        return {"seconds": fixed, "mode": mode, "why": f"fixed by the job's spec (checkpoint.interval: {fixed:g})"}
    cost, samples = measured_cost(session, job.id)
    used = cost if cost is not None else fit.ASSUMED_COST_S
    if not attempt.use_spot:  # on-demand is not reclaimed: checkpoints only for a move or a crash
        return {"seconds": fit.MAX_INTERVAL_S, "mode": mode, "zone": zone_name(attempt), "zone_mtbf_s": None,
                "cost_s": round(used, 3), "cost_measured": cost is not None,
                "why": "on-demand: not reclaimed, so the longest interval (bounded)"}
    record = zone_record(session, attempt, now, history_days, job.team_id)
    mtbf = fit.mtbf_s(record)
    seconds = fit.young_daly(used, mtbf)
    bound = " (bounded)" if seconds in (fit.MIN_INTERVAL_S, fit.MAX_INTERVAL_S) else ""
    measured = f"measured C {used:.2f} s (median of {samples})" if cost is not None else \
        f"assumed C {used:g} s (none measured yet)"
    return {"seconds": round(seconds, 1), "mode": mode, "zone": zone_name(attempt), "zone_mtbf_s": round(mtbf, 1),
            "reclaims": record.reclaims, "exposure_s": round(record.exposure_s, 1), "risk": record.risk,
            "prior_mtbf_s": round(fit.prior_mtbf_s(record.risk), 1), "cost_s": round(used, 3),
            "cost_measured": cost is not None,
            "why": f"√(2·C·MTBF){bound}: zone MTBF {mtbf / 3600:.2f} h ({record.reclaims} reclaims in "
                   f"{record.exposure_s / 3600:.2f} h of spot), {measured}"}


def refresh(session: Session, job: Job, attempt: Attempt, events: list[Any], now: datetime, *,
            refresh_s: float, history_days: float) -> float | None:
    """The interval in force for the attempt (None: the trainer's own), fitted
    again when due; `events`: the batch just stored (a periodic commit makes it due)."""
    current = attempt.checkpoint_interval
    if attempt.state not in LIVE_ATTEMPT_STATES:
        return current.get("seconds") if current else None
    committed = any(e.type == protocol.CHECKPOINT_COMMITTED and e.data.get("reason") == "periodic" for e in events)
    checked = datetime.fromisoformat(current["checked_at"]) if current else None
    if current is not None and not committed and (now - checked).total_seconds() < refresh_s:
        return current.get("seconds")
    new = fitted(session, job, attempt, now, history_days)
    old_s = current.get("seconds") if current else None
    if current is None or current.get("mode") != new["mode"] or \
            (new["seconds"] is not None and fit.changed(old_s, new["seconds"])):
        attempt.checkpoint_interval = {**new, "since": now.isoformat(), "checked_at": now.isoformat()}
        session.add(Event(job_id=job.id, attempt_id=attempt.id, type=INTERVAL_EVENT, at=now,
                          data={**new, "previous_seconds": old_s}))
    else:  # within a tenth of the one in force: keep it (and why), look again later
        attempt.checkpoint_interval = {**current, "checked_at": now.isoformat()}
    return attempt.checkpoint_interval.get("seconds")
