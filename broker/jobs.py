"""The jobs service: what the API's job routes do, as plain functions that
take a session. Reads are scoped to a team; another team's job is "not
found", never "forbidden"."""
from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from spotbroker.broker.clock import SYSTEM_CLOCK, Clock
from spotbroker.broker.models import Attempt, Checkpoint, Event, Job
from spotbroker.broker.spec import JobSpec
from spotbroker.broker.states import LIVE_ATTEMPT_STATES, TERMINAL_JOB_STATES, JobState, transition


class JobNotFound(LookupError):
    pass


def submit(session: Session, team_id: int, spec: JobSpec, clock: Clock = SYSTEM_CLOCK,
           idempotency_key: str | None = None) -> Job:
    """Create a PENDING job. With an idempotency key, a job this team already
    created with the same key is returned instead (a retried request); two
    racing requests are settled by the unique constraint (see by_key)."""
    if idempotency_key is not None:
        existing = by_key(session, team_id, idempotency_key)
        if existing is not None:
            return existing
    now = clock.now()
    values = dict(team_id=team_id, name=spec.name, state=str(JobState.PENDING), spec=spec.stored(),
                  idempotency_key=idempotency_key, created_at=now, updated_at=now, next_check_at=now,
                  restarts=0, recoveries=0, version=1)
    # Plain inserts (no unit of work): submission is the API's hot path.
    job_id = session.execute(insert(Job).values(**values).returning(Job.id)).scalar_one()
    session.execute(insert(Event).values(job_id=job_id, type="submitted", at=now, data={"name": spec.name}))
    return Job(id=job_id, **values, attempts=[])  # a detached copy: attempts known empty


def by_key(session: Session, team_id: int, idempotency_key: str) -> Job | None:
    return session.scalar(select(Job).where(Job.team_id == team_id, Job.idempotency_key == idempotency_key))


def get(session: Session, team_id: int, job_id: int) -> Job:
    job = session.scalar(select(Job).where(Job.id == job_id, Job.team_id == team_id))
    if job is None:
        raise JobNotFound(job_id)
    return job


def list_jobs(session: Session, team_id: int, *, states: Sequence[JobState] = (),
              before: int | None = None, limit: int = 50) -> list[Job]:
    """Newest first; `before` is the cursor (the last id of the previous page)."""
    query = select(Job).where(Job.team_id == team_id)
    if states:
        query = query.where(Job.state.in_([str(s) for s in states]))
    if before is not None:
        query = query.where(Job.id < before)
    return list(session.scalars(query.order_by(Job.id.desc()).limit(limit)))


def events(session: Session, team_id: int, job_id: int, after: int | None = None) -> list[Event]:
    get(session, team_id, job_id)
    query = select(Event).where(Event.job_id == job_id)
    if after is not None:
        query = query.where(Event.id > after)
    return list(session.scalars(query.order_by(Event.id)))


def cancel(session: Session, team_id: int, job_id: int, clock: Clock = SYSTEM_CLOCK) -> Job:
    """Cancel in the database now; the reconciler then stops what still runs
    (an attempt in a final state whose resources are not yet released)."""
    job = get(session, team_id, job_id)
    if JobState(job.state) in TERMINAL_JOB_STATES:
        return job
    for attempt in job.attempts:
        if attempt.state in LIVE_ATTEMPT_STATES:
            transition(session, attempt, "CANCELLED", reason="cancelled", clock=clock)
    transition(session, job, JobState.CANCELLED, reason="cancelled by request", clock=clock)
    return job


class CheckpointNotFound(LookupError):
    pass


def checkpoints(session: Session, team_id: int, job_id: int) -> list[Checkpoint]:
    """Committed checkpoints of the job, newest step first."""
    get(session, team_id, job_id)
    return list(session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id)
                                .order_by(Checkpoint.step.desc(), Checkpoint.id.desc())))


def keep_checkpoint(session: Session, team_id: int, job_id: int, checkpoint_id: int) -> Checkpoint:
    """Mark a checkpoint as the one to keep: its KEEP marker in the store
    stops any keep-last-K clean-up from deleting it."""
    from spotbroker.agent.checkpoint import mark_keep

    get(session, team_id, job_id)
    ckpt = session.scalar(select(Checkpoint).where(Checkpoint.id == checkpoint_id, Checkpoint.job_id == job_id))
    if ckpt is None:
        raise CheckpointNotFound(checkpoint_id)
    mark_keep(ckpt.uri)
    ckpt.keep = True
    return ckpt


def current_attempt(job: Job) -> Attempt | None:
    live = [a for a in job.attempts if a.state in LIVE_ATTEMPT_STATES]
    return live[-1] if live else None
