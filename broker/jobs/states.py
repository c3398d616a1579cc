"""The job and attempt state machines: one transition table each, and the
one function that changes a state.

Nothing else writes a `state` column. `transition()` checks the move against
the table, writes the new state and an `events` row in the caller's
transaction, so a state and its event are committed together or not at all.
"""
from __future__ import annotations

from enum import StrEnum
from typing import Any

from sqlalchemy.orm import Session

from spotbroker.broker.clock import SYSTEM_CLOCK, Clock


class JobState(StrEnum):
    PENDING = "PENDING"
    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    PREEMPTING = "PREEMPTING"
    RECOVERING = "RECOVERING"
    HELD = "HELD"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class AttemptState(StrEnum):
    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    PREEMPTED = "PREEMPTED"
    CANCELLED = "CANCELLED"


class EndReason(StrEnum):
    """Why an attempt ended (`attempts.end_reason`), for the code that
    reads it: placement replays each zone's reclaims and refusals from it,
    and a move is told from a reclaim by it. `reason` keeps the words for
    people. While its job is PREEMPTING, the live attempt already holds why
    it is ending (a notice: PREEMPTED; the broker's own drain: MOVED)."""

    SUCCEEDED = "succeeded"        # exit 0
    FAILED = "failed"              # a non-zero exit
    LAUNCH_ERROR = "launch_error"  # the launch, or the node's start of the job, failed
    NO_CAPACITY = "no_capacity"    # the cloud refused the launch for capacity
    PREEMPTED = "preempted"        # the cloud reclaimed the node (a notice came, or the run ended while PREEMPTING)
    VANISHED = "vanished"          # the node went away, or its agent silent, without a notice
    MOVED = "moved"                # the broker drained it to run the job elsewhere (not a reclaim)
    CANCELLED = "cancelled"        # the job was cancelled


# The ends that count as the cloud taking a spot instance back.
RECLAIMED = frozenset({EndReason.PREEMPTED, EndReason.VANISHED})


def team_could_cause(end_reason: str | None, preemption_requested: bool) -> bool:
    """A reclaim its own team could have caused: a notice it asked for
    (`simulate-preemption`), or a node gone without one (a job can end its own
    node, or silence its agent). It is evidence for that team's placement and
    checkpoint interval only: another team's would let a tenant steer it."""
    return end_reason == EndReason.VANISHED or (end_reason == EndReason.PREEMPTED and preemption_requested)


J = JobState
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    # FAILED from PENDING/RECOVERING: no offer can ever fit the job.
    J.PENDING: frozenset({J.LAUNCHING, J.HELD, J.FAILED, J.CANCELLED}),
    # LAUNCHING -> LAUNCHING is a failover to the next offer.
    J.LAUNCHING: frozenset({J.LAUNCHING, J.RUNNING, J.SUCCEEDED, J.FAILED, J.RECOVERING,
                            J.PREEMPTING, J.CANCELLED, J.PENDING}),
    # -> PENDING: a pre-flight passed; the job is placed for its real run (broker/recovery/preflight.py).
    J.RUNNING: frozenset({J.PREEMPTING, J.SUCCEEDED, J.RECOVERING, J.FAILED, J.HELD, J.CANCELLED, J.PENDING}),
    J.PREEMPTING: frozenset({J.RECOVERING, J.SUCCEEDED, J.FAILED, J.CANCELLED}),
    J.RECOVERING: frozenset({J.LAUNCHING, J.HELD, J.FAILED, J.CANCELLED}),
    J.HELD: frozenset({J.PENDING, J.RECOVERING, J.CANCELLED}),
    J.SUCCEEDED: frozenset(),
    J.FAILED: frozenset(),
    J.CANCELLED: frozenset(),
}

A = AttemptState
ATTEMPT_TRANSITIONS: dict[AttemptState, frozenset[AttemptState]] = {
    A.LAUNCHING: frozenset({A.RUNNING, A.SUCCEEDED, A.FAILED, A.PREEMPTED, A.CANCELLED}),
    A.RUNNING: frozenset({A.SUCCEEDED, A.FAILED, A.PREEMPTED, A.CANCELLED}),
    A.SUCCEEDED: frozenset(),
    A.FAILED: frozenset(),
    A.PREEMPTED: frozenset(),
    A.CANCELLED: frozenset(),
}

TERMINAL_JOB_STATES = frozenset(s for s, nxt in JOB_TRANSITIONS.items() if not nxt)
LIVE_JOB_STATES = frozenset(JobState) - TERMINAL_JOB_STATES
LIVE_ATTEMPT_STATES = frozenset({A.LAUNCHING, A.RUNNING})


class IllegalTransition(RuntimeError):
    pass


def transition(
    session: Session,
    obj: Any,
    to: JobState | AttemptState,
    *,
    reason: str | None = None,
    end: EndReason | None = None,
    data: dict[str, Any] | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> None:
    """Move a Job or an Attempt to `to` and record the event, in `session`.
    An attempt that ends says why with `end` (stored in `end_reason`)."""
    from spotbroker.broker.store.models import Attempt, Event, Job

    if isinstance(obj, Job):
        table, kind, job_id, attempt_id = JOB_TRANSITIONS, "job", obj.id, None
        current = JobState(obj.state)
    elif isinstance(obj, Attempt):
        table, kind, job_id, attempt_id = ATTEMPT_TRANSITIONS, "attempt", obj.job_id, obj.id
        current = AttemptState(obj.state)
    else:
        raise TypeError(f"transition() takes a Job or an Attempt, not {type(obj).__name__}")
    if to not in table[current]:
        raise IllegalTransition(f"{kind} {obj.id}: {current} -> {to} is not allowed")
    if kind == "attempt" and to not in LIVE_ATTEMPT_STATES and end is None:
        raise TypeError(f"attempt {obj.id} ends {to} without an end reason")

    now = clock.now()
    obj.state = str(to)
    obj.updated_at = now
    # the move itself wins over a same-named key in `data`
    payload: dict[str, Any] = {**(data or {}), "from": str(current), "to": str(to)}
    if reason:
        payload["reason"] = reason
    if kind == "attempt":
        if to == A.RUNNING and obj.started_at is None:
            obj.started_at = now
        if to not in LIVE_ATTEMPT_STATES:
            obj.ended_at = now
            obj.reason = reason
            obj.end_reason = str(end)
    else:
        if to in TERMINAL_JOB_STATES:
            obj.ended_at = now
        if reason:
            obj.reason = reason
        elif to in (J.RUNNING, J.SUCCEEDED):
            obj.reason = None  # why it waited, or the preemption it recovered from, is history now
    session.add(Event(job_id=job_id, attempt_id=attempt_id, type=f"{kind}_state", at=now, data=payload))
