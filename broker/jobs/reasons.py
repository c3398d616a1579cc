"""Why a job that does not run waits: the words of `jobs.reason` for each
wait, one prefix per kind, so a reader (and the code that clears a wait
once the job launches) tells them apart. Holds (HELD) say their own:
"over budget: ...", "held by a limit: ..." (broker/teampolicy/limits.py).

A job waiting for one of the local launcher's slots says how many jobs are
ahead of it in the queue (their number only: the queue is every team's).
"""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from spotbroker.broker.jobs.states import JobState
from spotbroker.broker.store.models import Job, Team

QUEUED = "queued: waiting to be placed"
WAITING_SPOT = "waiting for spot: "          # the placement policy waits for spot capacity or a better price
WAITING_CAPACITY = "waiting for capacity: "  # every place tried refused, or no cluster has room
WAITING_SLOT = "waiting for a local slot: "
WAITING_LIMIT = "waiting for a place within the team's limits: "
# The placement waits that the jobs-waiting metric counts.
PLACEMENT_WAITS = (WAITING_SPOT, WAITING_CAPACITY)
_QUEUE_STATES = (str(JobState.PENDING), str(JobState.RECOVERING))
NOT_RUNNING = (JobState.PENDING, JobState.LAUNCHING, JobState.PREEMPTING, JobState.RECOVERING, JobState.HELD)
MAX_MARKED = 200  # jobs told their place in the queue (those behind stay "queued")
TELL_EVERY_S = 1.0  # at most this often per reconciler: a burst of submissions hints a pass each


def is_wait(reason: str | None) -> bool:
    """A reason that a launch makes stale (not a launch's own retry, nor a hold)."""
    return (reason or "").startswith(("waiting for ", QUEUED))


def placement_wait(why: str) -> str:
    """The job's reason when placement decides it is to wait (`why`: the decision's words)."""
    kind = WAITING_CAPACITY if why.startswith("no Kubernetes place") else WAITING_SPOT
    return kind + why


def capacity_wait(why: str) -> str:
    return f"{WAITING_CAPACITY}every place tried refused the launch (the last: {why}); placed again shortly"


def slot_wait(ahead: int, slots: int) -> str:
    queue = "no job" if ahead == 0 else "1 job" if ahead == 1 else f"{ahead} jobs"
    return f"{WAITING_SLOT}all {slots} in use, {queue} ahead of it"


def _due_queue(session: Session, now: datetime, limit: int):
    return session.execute(
        select(Job.id, Job.reason).where(Job.state.in_(_QUEUE_STATES), Job.next_check_at <= now)
        .order_by(Job.id).limit(limit)).all()


def mark_slot_waits(session: Session, slots: int, now: datetime) -> int:
    """Every local slot is taken: the jobs due to be placed are told so, with
    how many are ahead of each (first submitted, first served). Written
    only where the words change; how many were."""
    changed = 0
    for ahead, (job_id, reason) in enumerate(_due_queue(session, now, MAX_MARKED)):
        wanted = slot_wait(ahead, slots)
        if reason != wanted:
            # A plain update, only while the job still waits: a cancel meanwhile wins.
            session.execute(update(Job).where(Job.id == job_id, Job.state.in_(_QUEUE_STATES))
                            .values(reason=wanted))
            changed += 1
    return changed


def slots_ahead(session: Session, job_id: int, now: datetime) -> int:
    """How many jobs due to be placed were submitted before this one."""
    return sum(1 for other, _ in _due_queue(session, now, MAX_MARKED) if other < job_id)


def not_running(session: Session, team: str, limit: int = 100):
    """The team's live jobs that do not run, oldest first: (id, name, state, reason, updated_at)."""
    return session.execute(
        select(Job.id, Job.name, Job.state, Job.reason, Job.updated_at).join(Team, Team.id == Job.team_id)
        .where(Team.name == team, Job.state.in_([str(s) for s in NOT_RUNNING])).order_by(Job.id).limit(limit)).all()
