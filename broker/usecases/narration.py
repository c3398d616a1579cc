"""A job's story in lines, for someone following its output across attempts
(`spotbroker logs ID -f`, `GET /v1/jobs/{id}/logs?follow=true`).

A follower reads a `JobView` at each change it is woken for and says, in one
line between the attempts' output, what changed: where the first attempt
runs, why an attempt ended and where the next one runs ("preempted at step
65, resuming on azure northcentralus"), why the job waits (its `reason`,
said again only when it changes), and how it ended.
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from spotbroker.broker.jobs import logs
from spotbroker.broker.jobs.states import LIVE_ATTEMPT_STATES, TERMINAL_JOB_STATES, EndReason, JobState
from spotbroker.broker.store.models import Checkpoint, Event
from spotbroker.broker.usecases.jobs import get

DASH = "\u2014"  # the em dash that sets a story line apart from the trainer's own output


@dataclass(frozen=True)
class AttemptView:
    id: int
    state: str
    end_reason: str | None
    reason: str | None
    exit_code: int | None
    num_nodes: int
    place: str
    use_spot: bool
    step: int | None  # the newest checkpoint the job had committed when (or since) this attempt ran
    log_removed: int | None = None  # bytes of its output removed to keep the job's logs within their bound

    @property
    def ended(self) -> bool:
        return self.state not in LIVE_ATTEMPT_STATES


@dataclass(frozen=True)
class JobView:
    id: int
    state: str
    reason: str | None
    attempts: tuple[AttemptView, ...]

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL_JOB_STATES

    def after(self, attempt_id: int | None) -> AttemptView | None:
        """The first attempt after `attempt_id` (None: the first of all)."""
        return next((a for a in self.attempts if attempt_id is None or a.id > attempt_id), None)

    def attempt(self, attempt_id: int) -> AttemptView | None:
        return next((a for a in self.attempts if a.id == attempt_id), None)


def view(session: Session, team_id: int, job_id: int) -> JobView:
    """The job as a follower sees it now (JobNotFound for another team's)."""
    job = get(session, team_id, job_id)
    steps = dict(session.execute(select(Checkpoint.attempt_id, func.max(Checkpoint.step))
                                 .where(Checkpoint.job_id == job.id).group_by(Checkpoint.attempt_id)).all())
    removed = {attempt_id: data.get("bytes") if isinstance(data, dict) else 0 for attempt_id, data in session.execute(
        select(Event.attempt_id, Event.data).where(Event.job_id == job.id, Event.type == logs.REMOVED_EVENT))}
    newest: int | None = None
    attempts = []
    for a in job.attempts:  # oldest first: an attempt resumes from the newest step of any before it
        if steps.get(a.id) is not None:
            newest = max(newest or 0, steps[a.id])
        place = " ".join(p for p in (a.cloud, a.zone or a.region or a.zone_id) if p)
        attempts.append(AttemptView(a.id, a.state, a.end_reason, a.reason, a.exit_code, a.num_nodes, place,
                                    a.use_spot, newest, removed.get(a.id)))
    return JobView(job.id, job.state, job.reason, tuple(attempts))


def line(text: str) -> bytes:
    return f"{DASH} {text} {DASH}\n".encode()


def began(a: AttemptView) -> str:
    return f"attempt {a.id} on {a.place}{'' if a.use_spot else ' (on-demand)'}"


def ended(a: AttemptView) -> str:
    """Why an attempt ended, in words."""
    at = f" at step {a.step}" if a.step is not None else " before any checkpoint"
    end = a.end_reason
    if end == EndReason.PREEMPTED:
        return f"preempted{at}"
    if end == EndReason.VANISHED:
        return f"node lost{at}"
    if end == EndReason.MOVED:
        return f"moved{at}"
    if end == EndReason.NO_CAPACITY:
        return f"no capacity on {a.place}"
    if end == EndReason.FAILED:
        return f"exited {a.exit_code}" if a.exit_code is not None else "failed"
    if end == EndReason.LAUNCH_ERROR:
        return f"launch failed: {a.reason}" if a.reason else "launch failed"
    return (a.reason or a.state.lower()).replace("\n", " ")


def next_on(before: AttemptView | None, a: AttemptView) -> str:
    """The line that opens attempt `a`: what ended `before` (None: `a` is
    the first followed) and where `a` runs."""
    if before is None:
        return began(a)
    verb = "resuming" if before.step is not None else "restarting"
    return f"attempt {before.id} {ended(before)}, {verb} on {a.place} (attempt {a.id})"


def removed(a: AttemptView) -> str:
    """The line in place of an attempt's output that was removed."""
    return (f"attempt {a.id}'s output ({a.log_removed} bytes) was removed to keep the job's logs within "
            "SPOTBROKER_MAX_JOB_LOG_BYTES")


def waiting(job: JobView) -> str:
    """Why the job waits: its state and its reason."""
    return f"job {job.id} {job.state}" + (f": {job.reason}" if job.reason else "")


def final(job: JobView) -> str:
    reason = job.reason if job.state != JobState.SUCCEEDED else None
    return f"job {job.id} {job.state}" + (f": {reason}" if reason else "")
