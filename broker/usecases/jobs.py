"""The job use cases: what the API's job routes do, as plain functions that
take a session. Reads are scoped to a team; another team's job is "not
found", never "forbidden"."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import insert, select, tuple_, update
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.checkpoints import records
from spotbroker.broker.clock import SYSTEM_CLOCK, Clock
from spotbroker.broker.jobs import logs, reasons, sealed
from spotbroker.broker.jobs.spec import JobSpec, public
from spotbroker.broker.jobs.states import (
    LIVE_ATTEMPT_STATES,
    TERMINAL_JOB_STATES,
    AttemptState,
    EndReason,
    JobState,
    transition,
)
from spotbroker.broker.launch.base import Launcher, LaunchError
from spotbroker.broker.store.models import Attempt, Checkpoint, Event, Job, JobLabel
from spotbroker.broker.store.sealing import Keyring


class JobNotFound(LookupError):
    pass


@dataclass(frozen=True)
class Submission:
    team_id: int
    spec: JobSpec
    idempotency_key: str | None = None
    hold: str | None = None  # why it is HELD from the start (intake.admit), if it is
    digest: str | None = None  # with a key: the sha256 of the request (what a retry is compared by)


def submit(session: Session, team_id: int, spec: JobSpec, clock: Clock = SYSTEM_CLOCK,
           idempotency_key: str | None = None, keyring: Keyring | None = None) -> Job:
    """Create a PENDING job (see submit_many)."""
    return submit_many(session, [Submission(team_id, spec, idempotency_key)], clock, keyring)[0]


def submit_many(session: Session, subs: Sequence[Submission], clock: Clock = SYSTEM_CLOCK,
                keyring: Keyring | None = None) -> list[Job]:
    """Create PENDING jobs and their "submitted" events: one statement for the
    jobs and one for the events, whatever their number (the API groups
    submissions that arrive together). With an idempotency key, a job the
    team already created with that key is returned instead (a retried
    request); two racing requests are settled by the unique constraint.
    Secrets' values are stored sealed with `keyring` (required for a job that has any)."""
    if keyring is None and any(s.spec.secrets for s in subs):
        raise ValueError("a job's secrets are stored sealed: submit it with the broker's keyring")
    now = clock.now()
    keys = {(s.team_id, s.idempotency_key) for s in subs if s.idempotency_key is not None}
    known: dict[tuple[int, str], Job] = {}
    if keys:
        for job in session.scalars(select(Job).where(tuple_(Job.team_id, Job.idempotency_key).in_(keys))):
            known[(job.team_id, job.idempotency_key)] = job
    rows, first_of_key = [], {}
    for i, s in enumerate(subs):
        key = (s.team_id, s.idempotency_key)
        if s.idempotency_key is not None and (key in known or key in first_of_key):
            continue
        first_of_key.setdefault(key, i)
        stored = sealed.seal(s.spec.stored(), s.team_id, keyring) if s.spec.secrets else s.spec.stored()
        state = JobState.HELD if s.hold else JobState.PENDING
        rows.append((i, dict(team_id=s.team_id, name=s.spec.name, state=str(state), reason=s.hold or reasons.QUEUED,
                             spec=stored, idempotency_key=s.idempotency_key,
                             idempotency_digest=s.digest if s.idempotency_key is not None else None, created_at=now,
                             updated_at=now, next_check_at=now, restarts=0, recoveries=0, version=1)))
    made: dict[int, Job] = {}
    if rows:
        # Plain inserts (no unit of work): submission is the API's hot path.
        ids = session.scalars(insert(Job).returning(Job.id, sort_by_parameter_order=True),
                              [values for _, values in rows]).all()
        made_events = [dict(job_id=job_id, attempt_id=None, type="submitted", at=now, data={"name": values["name"]})
                       for job_id, (_, values) in zip(ids, rows, strict=True)]
        # A job held from the start says so as any hold does (the reconciler releases it).
        made_events += [dict(job_id=job_id, attempt_id=None, type="job_state", at=now,
                             data={"from": str(JobState.PENDING), "to": str(JobState.HELD), "reason": values["reason"]})
                        for job_id, (_, values) in zip(ids, rows, strict=True) if values["state"] == JobState.HELD]
        session.execute(insert(Event), made_events)
        labels = [dict(job_id=job_id, key=k, team_id=values["team_id"], value=v)
                  for job_id, (i, values) in zip(ids, rows, strict=True) for k, v in subs[i].spec.labels.items()]
        if labels:  # what costs group by (`group_by=label:KEY`)
            session.execute(insert(JobLabel), labels)
        for job_id, (i, values) in zip(ids, rows, strict=True):
            made[i] = Job(id=job_id, **values, attempts=[])  # a detached copy: attempts known empty
    out = []
    for i, s in enumerate(subs):
        key = (s.team_id, s.idempotency_key)
        out.append(made.get(i) or known.get(key) or made[first_of_key[key]])
    return out


def same_spec(shown: dict, spec: JobSpec) -> bool:
    """Whether a job the API shows as `shown` is what `spec` asks for (a
    retried submission); secrets are compared by name, as the API shows them."""
    canonical = lambda d: json.dumps(d, sort_keys=True, default=str)  # noqa: E731
    return canonical(public(shown)) == canonical(public(spec.stored()))


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


def events(session: Session, team_id: int, job_id: int, after: int | None = None,
           limit: int | None = None) -> list[Event]:
    """The job's events after id `after`, oldest first, at most `limit` of them."""
    get(session, team_id, job_id)
    query = select(Event).where(Event.job_id == job_id)
    if after is not None:
        query = query.where(Event.id > after)
    return list(session.scalars(query.order_by(Event.id).limit(limit)))


def cancel(session: Session, team_id: int, job_id: int, clock: Clock = SYSTEM_CLOCK) -> Job:
    """Cancel in the database now; the reconciler then stops what still runs
    (an attempt in a final state whose resources are not yet released)."""
    job = get(session, team_id, job_id)
    if JobState(job.state) in TERMINAL_JOB_STATES:
        return job
    for attempt in job.attempts:
        if attempt.state in LIVE_ATTEMPT_STATES:
            transition(session, attempt, AttemptState.CANCELLED, reason="cancelled", end=EndReason.CANCELLED,
                       clock=clock)
    transition(session, job, JobState.CANCELLED, reason="cancelled by request", clock=clock)
    return job


def checkpoints(session: Session, team_id: int, job_id: int, limit: int | None = None,
                before: tuple[int, int] | None = None) -> list[Checkpoint]:
    """Committed checkpoints of the team's job, newest step first (a page: records.committed)."""
    get(session, team_id, job_id)
    return records.committed(session, job_id, limit, before)


def keep_checkpoint(session: Session, team_id: int, job_id: int, checkpoint_id: int,
                    checkpoint_root: str) -> Checkpoint:
    """Keep a checkpoint of the team's job (broker/checkpoints/records.py:
    `keep`): CheckpointNotFound, CheckpointUnverified."""
    return records.keep(session, get(session, team_id, job_id), checkpoint_id, checkpoint_root)


def current_attempt(job: Job) -> Attempt | None:
    live = [a for a in job.attempts if a.state in LIVE_ATTEMPT_STATES]
    return live[-1] if live else None


class AttemptNotFound(LookupError):
    pass


class LogRemoved(LookupError):
    """The attempt's log went to keep its job's logs within their bound (logs.keep_within)."""


@dataclass(frozen=True)
class LogStart:
    """Where to read an attempt's output: node `rank`'s log from `offset` (the
    start of the last lines asked for) to `end` (its length at the request)."""

    attempt_id: int
    rank: int
    offset: int
    end: int


def log_start(factory: sessionmaker[Session], team_id: int, job_id: int, attempt_id: int | None = None,
              lines: int | None = None, rank: int = 0) -> LogStart | None:
    """The output of node `rank` of the job's attempt `attempt_id` (default:
    the newest) from its last `lines` lines (all when None); None when the
    job has no attempt yet. The session is a short one of its own: none is
    held while a client reads or follows the log."""
    with factory() as session:
        job = get(session, team_id, job_id)
        if not job.attempts:
            return None
        chosen = next((a for a in job.attempts if a.id == attempt_id), None) if attempt_id else job.attempts[-1]
        if chosen is None:
            raise AttemptNotFound(f"job {job_id} has no attempt {attempt_id}")
        if rank >= chosen.num_nodes:
            raise AttemptNotFound(f"attempt {chosen.id} of job {job_id} has {chosen.num_nodes} node(s): "
                                  f"no node {rank}")
        offset, end = logs.tail_start(session, chosen.id, rank, lines)
        if not end and (gone := logs.removed(session, job_id, chosen.id)) is not None:
            raise LogRemoved(f"attempt {chosen.id}'s log ({gone} bytes) was removed: a job's ended attempts keep "
                             "at most SPOTBROKER_MAX_JOB_LOG_BYTES of logs together, the oldest going first")
        return LogStart(chosen.id, rank, offset, end)


class NotPreemptible(RuntimeError):
    """The job has no running attempt whose cloud can be made to send a notice."""


def _notice_target(job: Job, launchers: Mapping[str, Launcher]) -> tuple[Attempt, Launcher]:
    """The job's running attempt and its launcher, if that launcher simulates a
    cloud (the local one has `simulate_preemption`): a real cloud's notice cannot be forged."""
    attempt = current_attempt(job)
    launcher = launchers.get(attempt.launcher) if attempt else None
    if attempt is None or attempt.handle is None or not hasattr(launcher, "simulate_preemption"):
        raise NotPreemptible("only a running attempt on the local launcher can be preempted on request")
    if attempt.cloud == "k8s":
        raise NotPreemptible("the attempt runs on a Kubernetes place, which no cloud reclaims: there is no "
                             "preemption notice to simulate")
    return attempt, launcher


def await_simulated_cloud(session_factory: sessionmaker, team_id: int, job_id: int,
                          launchers: Mapping[str, Launcher]) -> None:
    """A node starts its simulated cloud just after its launch: a notice asked
    for at once waits for it here, before `simulate_preemption`'s write
    transaction (a writer held while a node starts would stall every other)."""
    with session_factory() as session:
        attempt, launcher = _notice_target(get(session, team_id, job_id), launchers)
        handle = attempt.handle
    launcher.simulator_url(handle)


def simulate_preemption(session: Session, team_id: int, job_id: int, launchers: Mapping[str, Launcher]) -> Job:
    """Make the job's running attempt's simulated cloud send its preemption
    notice. `session` writes (db.transaction)."""
    job = get(session, team_id, job_id)
    attempt, launcher = _notice_target(job, launchers)
    # A reclaim the team asked for steers no other team (histories.py): marked in the caller's
    # transaction (a write one), which a failed send rolls back.
    session.execute(update(Attempt).where(Attempt.id == attempt.id).values(preemption_requested=True))
    try:
        launcher.simulate_preemption(attempt.handle)
    except LaunchError as exc:
        raise NotPreemptible(str(exc)) from None
    return job
