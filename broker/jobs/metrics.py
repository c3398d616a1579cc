"""A job's metrics: the points its trainer reported (`ckpt.report`), stored
per attempt as the agent forwards them, and read back as one series per
metric across the job's attempts.

Bounded whatever an agent sends: a point whose name is not a metric name or
whose value is not a finite number is dropped; a job holds at most
`MAX_NAMES` names and `MAX_POINTS_PER_JOB` points, an attempt at most
`MAX_POINTS_PER_ATTEMPT` (a job preempted a thousand times, by its own
team's `simulate-preemption`, stored ten million before);
and a point that comes within `FOLD_SECONDS` of the same attempt's newest
point of that name (by the agent's clock) replaces it instead of adding a
row, as the agent itself folds. What is dropped is said once per attempt,
by a `metrics_dropped` event.
"""
from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from spotbroker.agent.metricsfold import finite, is_count
from spotbroker.broker.jobs.stoprule import METRIC_NAME
from spotbroker.broker.store.metricmodels import MetricPoint
from spotbroker.broker.store.models import Attempt, Event, Job

MAX_NAMES = 32
MAX_POINTS_PER_ATTEMPT = 10_000
MAX_POINTS_PER_JOB = 50_000
FOLD_SECONDS = 2.0
DROPPED = "metrics_dropped"  # the broker's event: points an attempt sent past the bounds
_NAME = re.compile(METRIC_NAME)


def record(session: Session, job: Job, attempt: Attempt, data: dict[str, Any], at: datetime,
           now: datetime) -> bool:
    """Store one `metrics` event's points; whether any was stored or folded."""
    return record_many(session, job, attempt, [(data, at)], now)


def record_many(session: Session, job: Job, attempt: Attempt, reports: list[tuple[dict[str, Any], datetime]],
                now: datetime) -> bool:
    """Store a batch's `metrics` events (data, the agent's time) in order; whether
    any point was stored or folded. A few reads and one flush whatever the
    batch's size: a point a query at a time held SQLite's write lock for
    seconds over an agent's backlog of a thousand reports."""
    names = set(session.scalars(select(MetricPoint.name).where(MetricPoint.job_id == job.id).distinct()))
    in_job, stored = session.execute(select(func.count(), func.count().filter(MetricPoint.attempt_id == attempt.id))
                                     .where(MetricPoint.job_id == job.id)).one()
    rows = {p.name: p for p in session.scalars(select(MetricPoint).where(MetricPoint.id.in_(
        select(func.max(MetricPoint.id)).where(MetricPoint.attempt_id == attempt.id).group_by(MetricPoint.name))))}
    newest = {name: {"step": p.step, "value": p.value, "at": p.at} for name, p in rows.items()}
    added: list[dict[str, Any]] = []  # rows, not objects: one executemany, no ORM instance per point
    folded: set[str] = set()  # names whose stored newest point a report replaced
    dropped: list[str] = []
    for data, at in reports:
        step, values = data.get("step"), data.get("values")
        if not is_count(step) or not isinstance(values, dict):
            dropped.append("a report without an integer step and a values mapping")
            continue
        points = {k: float(v) for k, v in values.items() if isinstance(k, str) and _NAME.fullmatch(k) and finite(v)}
        if len(points) < len(values):
            dropped.append("names that are not metric names, or values that are not finite numbers")
        for name, value in points.items():
            last = newest.get(name)
            if last is not None and abs((at - last["at"]).total_seconds()) < FOLD_SECONDS and step >= last["step"]:
                last.update(step=step, value=value, at=at)  # a row of `added`, or a stored one (below)
                if "name" not in last:
                    folded.add(name)
                continue
            if name not in names and len(names) >= MAX_NAMES:
                dropped.append(f"more than {MAX_NAMES} metric names in the job")
                continue
            if stored >= MAX_POINTS_PER_ATTEMPT:
                dropped.append(f"more than {MAX_POINTS_PER_ATTEMPT} points in the attempt")
                break
            if in_job >= MAX_POINTS_PER_JOB:
                dropped.append(f"more than {MAX_POINTS_PER_JOB} points in the job")
                break
            newest[name] = {"job_id": job.id, "attempt_id": attempt.id, "name": name, "step": step, "value": value,
                            "at": at}
            added.append(newest[name])
            names.add(name)
            stored += 1
            in_job += 1
    for name in folded:
        row, last = rows[name], newest[name]
        row.step, row.value, row.at = last["step"], last["value"], last["at"]
    if dropped:
        _dropped(session, job, attempt, dropped, now)
    if added:
        session.execute(insert(MetricPoint), added)
    if folded or added:
        session.flush()
    return bool(folded or added)


def series(session: Session, job_id: int) -> dict[str, list[dict[str, Any]]]:
    """Every metric of the job: its points by step, across attempts (a step that
    a resumed attempt reported again appears once per attempt)."""
    rows = session.scalars(select(MetricPoint).where(MetricPoint.job_id == job_id)
                           .order_by(MetricPoint.name, MetricPoint.step, MetricPoint.id))
    out: dict[str, list[dict[str, Any]]] = {}
    for p in rows:
        out.setdefault(p.name, []).append({"step": p.step, "value": p.value, "attempt_id": p.attempt_id,
                                           "at": p.at})
    return out


def curve(session: Session, job_id: int, name: str) -> list[tuple[int, float]]:
    """(step, value) of one metric by step; a step reported by several attempts
    counts once, as the newest report said it."""
    rows = session.execute(select(MetricPoint.step, MetricPoint.value).where(
        MetricPoint.job_id == job_id, MetricPoint.name == name).order_by(MetricPoint.step, MetricPoint.id))
    by_step: dict[int, float] = {}
    for step, value in rows:
        by_step[step] = value
    return sorted(by_step.items())


def _dropped(session: Session, job: Job, attempt: Attempt, whys: list[str], now: datetime) -> None:
    """A `metrics_dropped` event for each reason not told on the attempt before."""
    told = {d.get("reason") for d in session.scalars(select(Event.data).where(
        Event.attempt_id == attempt.id, Event.type == DROPPED)) if isinstance(d, dict)}
    for why in dict.fromkeys(whys):
        if why not in told:
            session.add(Event(job_id=job.id, attempt_id=attempt.id, type=DROPPED, at=now, data={"reason": why}))
