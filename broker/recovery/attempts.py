"""Recovery: how an attempt ends, and what its job does next.

Every way an attempt ends goes through here, and so does what follows:

    notice:    RUNNING --preemption_notice--> PREEMPTING (the attempt is ending PREEMPTED);
               a notice on any node of a multi-node attempt tells every node's agent `drain: true`
    move:      RUNNING --the policy moves it--> PREEMPTING "moving: ..." (ending MOVED);
               the agent is told `drain: true` until the flush is in
    flush:     PREEMPTING --checkpoint_committed / no_flush / the run ended--> RECOVERING,
               the attempt PREEMPTED (or MOVED, which is not a reclaim)
    drain timeout: a move whose flush never came --> RECOVERING all the same
    vanished:  a node gone (or its agent silent) without a notice --> RECOVERING, the attempt VANISHED;
               the second in a row and after wait longer each time (back-off)
    exit:      exit 0 --> SUCCEEDED; a non-zero exit --> RECOVERING while restarts remain
               (`max_restarts`), else FAILED
    launch:    a capacity refusal --> the attempt NO_CAPACITY, the next place or a wait;
               a launch error --> FAILED
    start:     a node that failed to start the job's command (E2BIG, provisioning) --> the attempt
               LAUNCH_ERROR, RECOVERING after a back-off while `launch_retries` remain, else FAILED

Every way back to RECOVERING is bounded: restarts by the job's `max_restarts`,
failed starts by `Bounds.launch_retries`, and reclaims (preemptions and
vanished nodes, which are the cloud's doing and not counted as restarts) by
`Bounds.max_recoveries`, checked when the job is placed again.

The attempt's `end_reason` (an `EndReason`) is what code reads: placement
replays each zone's record from it, and a move is told from a reclaim by
it. While its job is PREEMPTING, the live attempt already holds why it is
ending. The `reason` words are for people.

RECOVERING starts as soon as the flush is committed, or none will come, or
the run ended, whichever is first: the new attempt does not wait for the
old node to die (the reconciler's release phase stops what is left of it).
The functions take the caller's session and change nothing outside it; the
ones that return a bool say whether the reconciler should look now.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from spotbroker.agent import protocol
from spotbroker.broker.clock import Clock
from spotbroker.broker.jobs import reasons
from spotbroker.broker.jobs.runs import RunState, RunStatus
from spotbroker.broker.jobs.states import (
    LIVE_ATTEMPT_STATES,
    LIVE_JOB_STATES,
    AttemptState,
    EndReason,
    JobState,
    transition,
)
from spotbroker.broker.jobs.stored import spec_of
from spotbroker.broker.recovery import earlystop, preflight
from spotbroker.broker.store.models import Attempt, Event, Job

A, J, E = AttemptState, JobState, EndReason
MOVING = "moving: "  # the words of a PREEMPTING the broker started (a move), for people
MAX_BACKOFF_S = 600.0


@dataclass(frozen=True)
class Bounds:
    """How far a job is recovered before it fails (the broker's settings)."""

    launch_retries: int = 2        # starts a node failed, tried again (SPOTBROKER_LAUNCH_RETRIES)
    retry_seconds: float = 10.0    # the first wait after one; doubling (SPOTBROKER_LAUNCH_RETRY_SECONDS)
    max_recoveries: int = 100      # preemptions and vanished nodes per job (SPOTBROKER_MAX_RECOVERIES)

    @classmethod
    def from_settings(cls, settings: Any) -> Bounds:
        return cls(settings.launch_retries, settings.launch_retry_seconds, settings.max_recoveries)

    def backoff(self, n: int) -> float:
        """The wait before the next try after the `n`-th failure in a row."""
        return min(self.retry_seconds * 2 ** min(max(n - 1, 0), 30), MAX_BACKOFF_S)


def live_attempt(job: Job) -> Attempt | None:
    return next((a for a in job.attempts if a.state in LIVE_ATTEMPT_STATES), None)


def is_move(job: Job) -> bool:
    """Is the job PREEMPTING because the broker moves it (not the cloud)?"""
    attempt = live_attempt(job) if job.state == J.PREEMPTING else None
    return attempt is not None and attempt.end_reason == E.MOVED


# --- a preemption, told by the agent ---------------------------------------------------

def on_agent_event(session: Session, job: Job, attempt: Attempt, kind: str, data: dict[str, Any],
                   clock: Clock) -> bool:
    """What an agent's report of the job's current attempt changes of its end:
    a notice starts PREEMPTING, a flush (or word that none will come) ends
    it. Returns whether the job changed state."""
    if kind == protocol.PREEMPTION_NOTICE and is_move(job) and data.get("kind") != "drain":
        # the cloud reclaims the node we were moving off: it is a preemption
        job.reason, attempt.end_reason = "preemption notice", E.PREEMPTED
        return False
    if kind == protocol.PREEMPTION_NOTICE and job.state in (J.LAUNCHING, J.RUNNING):
        attempt.end_reason = E.PREEMPTED  # what it is ending for
        transition(session, job, J.PREEMPTING, reason="preemption notice",
                   data={"attempt_id": attempt.id, "deadline": data.get("deadline")}, clock=clock)
        return True
    if job.state == J.PREEMPTING and kind == protocol.NO_FLUSH and _finished(session, attempt):
        # The run ended well before the flush was asked (its agent says so): nothing to
        # recover; the launcher's end of the run makes the job SUCCEEDED (on_status).
        return False
    if job.state == J.PREEMPTING and (
            kind == protocol.NO_FLUSH
            or (kind == protocol.CHECKPOINT_COMMITTED and data.get("reason") != "periodic")):
        why = "checkpoint committed" if kind == protocol.CHECKPOINT_COMMITTED else "no flush will come"
        preempted(session, job, attempt, why, clock)
        return True
    return False


def _finished(session: Session, attempt: Attempt) -> bool:
    """Whether a one-node attempt's trainer told of its exit with code 0 (a
    job that ended while a move drained it was run again from its start)."""
    if attempt.num_nodes != 1:
        return False
    told = session.scalars(select(Event.data).where(Event.attempt_id == attempt.id,
                                                    Event.type == protocol.TRAINER_EXITED))
    return any(data.get("exit_code") == 0 for data in told)


def preempted(session: Session, job: Job, attempt: Attempt, why: str, clock: Clock) -> None:
    """The attempt is lost to a preemption, or left for a move: recover on a
    new one now, without waiting for the old node to die (the release phase
    stops what is left). A move is not counted as a preemption: it ends
    MOVED, which placement does not count against the zone."""
    move = attempt.end_reason == E.MOVED
    if attempt.state in LIVE_ATTEMPT_STATES:
        end = E.MOVED if move else E.PREEMPTED
        transition(session, attempt, A.PREEMPTED, reason=str(end), end=end, clock=clock)
        attempt.released = False
    if not move:
        job.recoveries += 1
    transition(session, job, J.RECOVERING, reason=f"{'moved' if move else 'preempted'}: {why}", clock=clock)
    job.next_check_at = clock.now()


def peers_drain(job: Job, attempt: Attempt) -> bool:
    """A multi-node attempt ending for one node's notice: every node's agent
    is told to flush too (each node's trainer hears only its own agent)."""
    return job.state == J.PREEMPTING and attempt.num_nodes > 1 and live_attempt(job) is attempt


# --- a move, started by the broker -----------------------------------------------------

def start_move(session: Session, job: Job, attempt: Attempt, why: str, towards: Iterable[str],
               drain_timeout_s: float, clock: Clock) -> None:
    """Drain the running attempt to place the job again (the policy's "move"):
    the agent is told to flush, and the job is placed again from that
    checkpoint, or from the last one after `drain_timeout_s`."""
    attempt.end_reason = E.MOVED  # what it is ending for: the move, not a reclaim
    transition(session, job, J.PREEMPTING, reason=f"{MOVING}{why}",
               data={"attempt_id": attempt.id, "towards": list(towards)}, clock=clock)
    job.next_check_at = clock.now() + timedelta(seconds=drain_timeout_s)


def drain_timed_out(session: Session, job: Job, clock: Clock) -> None:
    """A move whose agent never flushed (no agent, or no checkpoint library
    answering): move on from the last committed checkpoint."""
    attempt = live_attempt(job)
    if attempt is not None:
        preempted(session, job, attempt, "no flush came in time", clock)


# --- what the launcher saw the run do --------------------------------------------------

def on_status(session: Session, job: Job, attempt_id: int, status: RunStatus, clock: Clock,
              bounds: Bounds = Bounds()) -> bool:
    """React to what the launcher says of the attempt's run: up, ended, or
    gone. Returns whether the reconciler should look at the job now."""
    attempt = session.get(Attempt, attempt_id)
    if attempt is None or attempt.state not in LIVE_ATTEMPT_STATES:
        return False
    if status.error is not None:  # the node could not start the job
        attempt.released = False
        start_failed(session, job, attempt, status.error, clock, bounds)
        return False
    if attempt.preflight and (status.state == RunState.SUCCEEDED
                              or (status.state == RunState.FAILED and job.state != J.PREEMPTING)):
        return preflight.ended(session, job, attempt, status, clock)
    if status.state == RunState.RUNNING:
        if attempt.state == A.LAUNCHING:
            transition(session, attempt, A.RUNNING, clock=clock)
        if job.state == J.LAUNCHING:
            transition(session, job, J.RUNNING, data={"attempt_id": attempt.id}, clock=clock)
        return False
    attempt.exit_code = status.exit_code
    if job.state == J.PREEMPTING and status.state != RunState.SUCCEEDED:
        # The node was reclaimed (or the trainer stopped) before the
        # agent reported a flush: recover from what is committed.
        preempted(session, job, attempt, f"the attempt ended ({status.state.lower()})", clock)
        return True
    ended = status.state in (RunState.SUCCEEDED, RunState.FAILED)
    if ended and earlystop.on_run_ended(session, job, attempt, clock):
        attempt.released = True  # the run stopped for its early stop, whatever its exit code
        return False
    if status.state == RunState.SUCCEEDED:
        attempt.released = True  # the processes have exited
        transition(session, attempt, A.SUCCEEDED, reason="exit 0", end=E.SUCCEEDED, clock=clock)
        transition(session, job, J.SUCCEEDED, data={"attempt_id": attempt.id}, clock=clock)
        return False
    if status.state == RunState.FAILED:
        attempt.released = True
        return _exited(session, job, attempt, status.exit_code, clock)
    if status.state == RunState.GONE:
        vanished(session, job, attempt, clock, bounds)
        return True
    return False


def _exited(session: Session, job: Job, attempt: Attempt, exit_code: int | None, clock: Clock) -> bool:
    """A non-zero exit: restart while the job's restarts last, else the job fails."""
    transition(session, attempt, A.FAILED, reason=f"exit {exit_code}", end=E.FAILED, clock=clock)
    spec = spec_of(job)
    if job.restarts < spec.max_restarts:
        job.restarts += 1
        recover(session, job, f"exit {exit_code}; restart {job.restarts} of {spec.max_restarts}", clock)
        return True
    transition(session, job, J.FAILED, reason=f"exit code {exit_code}", data={"attempt_id": attempt.id},
               clock=clock)
    return False


def vanished(session: Session, job: Job, attempt: Attempt, clock: Clock, bounds: Bounds = Bounds()) -> None:
    """The node went away without a notice (its launcher lost it, or its agent
    went silent for a heartbeat timeout): a reclaim all the same. The first
    is recovered at once; each further one in a row waits longer, as nodes
    that vanish again and again are more likely broken than reclaimed."""
    transition(session, attempt, A.PREEMPTED, reason="vanished", end=E.VANISHED, clock=clock)
    job.recoveries += 1
    in_a_row = _ended_in_a_row(job, E.VANISHED)
    wait = bounds.backoff(in_a_row - 1) if in_a_row > 1 else 0.0
    recover(session, job, "node vanished without a notice" + (
        f" ({in_a_row} in a row; placed again in {wait:g} s)" if wait else ""), clock, wait)


def start_failed(session: Session, job: Job, attempt: Attempt, why: str, clock: Clock,
                 bounds: Bounds = Bounds()) -> None:
    """A node failed to start the job's command (the kernel refused it, or
    the node died while provisioning): a failed launch, tried again after a
    back-off while `launch_retries` remain, then the job fails with the cause."""
    if attempt.state in LIVE_ATTEMPT_STATES:
        transition(session, attempt, A.FAILED, reason="launch_error", end=E.LAUNCH_ERROR, data={"error": why},
                   clock=clock)
    if job.state not in LIVE_JOB_STATES:
        return
    failed = sum(1 for a in job.attempts if a.end_reason == E.LAUNCH_ERROR)
    if failed > bounds.launch_retries:
        tries = f" ({failed} tries)" if failed > 1 else ""
        transition(session, job, J.FAILED, reason=f"launch failed{tries}: {why}", data={"attempt_id": attempt.id},
                   clock=clock)
        return
    wait = bounds.backoff(failed)
    recover(session, job, f"launch failed: {why}; retry {failed} of {bounds.launch_retries} in {wait:g} s",
            clock, wait)


def recoveries_exhausted(session: Session, job: Job, bounds: Bounds, clock: Clock) -> bool:
    """Before a RECOVERING job is placed again: fail it, saying so, once its
    reclaims (preemptions and vanished nodes) are past `max_recoveries`."""
    if job.state != J.RECOVERING or job.recoveries <= bounds.max_recoveries:
        return False
    transition(session, job, J.FAILED, reason=f"reclaimed {job.recoveries} times, more than this broker recovers "
               f"(SPOTBROKER_MAX_RECOVERIES={bounds.max_recoveries}); the last: {job.reason}", clock=clock)
    return True


def _ended_in_a_row(job: Job, end: EndReason) -> int:
    """How many of the job's newest ended attempts ended `end`, one after another."""
    n = 0
    for a in sorted(job.attempts, key=lambda a: a.id, reverse=True):
        if a.state in LIVE_ATTEMPT_STATES:
            continue
        if a.end_reason != end:
            break
        n += 1
    return n


def recover(session: Session, job: Job, why: str, clock: Clock, wait_s: float = 0.0) -> None:
    """Place the job again (now, or after `wait_s`), from its newest committed checkpoint."""
    transition(session, job, J.RECOVERING, reason=why, clock=clock)
    job.next_check_at = clock.now() + timedelta(seconds=wait_s)
    data: dict[str, Any] = {"why": why, **({"wait_seconds": wait_s} if wait_s else {})}
    session.add(Event(job_id=job.id, type="recovery_scheduled", at=clock.now(), data=data))


# --- a launch that did not happen ------------------------------------------------------

def capacity_refused(session: Session, job: Job, attempt: Attempt, why: str, clock: Clock, *,
                     last: bool, retry_after_s: float) -> bool:
    """The cloud refused the launch for capacity: the attempt ends NO_CAPACITY
    (placement counts it against the zone). When it was the `last` place the
    decision offered, the job waits to be decided again on what was learnt.
    Returns whether the attempt ended here (not cancelled meanwhile)."""
    ended = attempt.state in LIVE_ATTEMPT_STATES
    if ended:
        transition(session, attempt, A.FAILED, reason="no_capacity", end=E.NO_CAPACITY, data={"error": why},
                   clock=clock)
    if last and job.state == J.LAUNCHING:  # every choice refused
        job.next_check_at = clock.now() + timedelta(seconds=retry_after_s)
        transition(session, job, J.RECOVERING, reason=reasons.capacity_wait(why), clock=clock)
    return ended


def refused_after_launch(session: Session, job: Job, attempt_id: int, why: str, clock: Clock,
                         retry_after_s: float = 0.0) -> Attempt | None:
    """A launcher that follows its launches after `launch` returned (SkyPilot)
    reports a capacity refusal through `status`: the same ending as a
    `CapacityError` raised by `launch`, and the job is placed again after
    `retry_after_s` (at once, unless a whole round was refused). The
    attempt, when it ended here (for placement to count it)."""
    attempt = session.get(Attempt, attempt_id)
    if attempt is None or attempt.state not in LIVE_ATTEMPT_STATES:
        return None
    attempt.released = False  # the release phase downs what it holds (a failed launch leaves a cluster INIT)
    ended = capacity_refused(session, job, attempt, why, clock, last=True, retry_after_s=retry_after_s)
    return attempt if ended else None


def launch_failed(session: Session, job: Job, attempt: Attempt, why: str, clock: Clock) -> None:
    """A launch failed for a reason that another place will not fix: the job fails."""
    if attempt.state in LIVE_ATTEMPT_STATES:
        transition(session, attempt, A.FAILED, reason="launch_error", end=E.LAUNCH_ERROR, data={"error": why},
                   clock=clock)
    if job.state in LIVE_JOB_STATES:
        transition(session, job, J.FAILED, reason=f"launch failed: {why}", clock=clock)
