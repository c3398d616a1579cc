"""A job's pre-flight, as the broker runs and judges it (the spec's side is
`broker/jobs/preflight.py`, the trainer's `agent/checkpoint/preflight.py`).

    PENDING --the policy picks the GPU place--> a pre-flight attempt on the cheapest CPU place
        (LAUNCHING, RUNNING as any attempt; `preflight_started` names the GPU place it stands in for)
    exit 0  --> the attempt SUCCEEDED, `preflight_passed` (duration, cost), the job PENDING:
                placed again for its real run, which no pre-flight precedes any more
    exit != 0, or past its timeout --> the attempt FAILED, `preflight_failed` (the log's last
                lines, duration, cost, and what the GPU launch would have cost: the GPU place's
                price x the time to the failure x nodes), the job FAILED before any GPU launch
    vanished, preempted, a node that did not start: as any attempt (the job recovers, and the
                pre-flight is tried again)
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from spotbroker.broker.clock import Clock
from spotbroker.broker.jobs import logs, reasons
from spotbroker.broker.jobs.preflight import FAILED, PASSED, STARTED, trial
from spotbroker.broker.jobs.runs import RunState, RunStatus
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.jobs.states import LIVE_ATTEMPT_STATES, AttemptState, EndReason, JobState, transition
from spotbroker.broker.jobs.stored import spec_of
from spotbroker.broker.money.costs import job_costs
from spotbroker.broker.placement.host import on_host
from spotbroker.broker.placement.policy import Action
from spotbroker.broker.pricing.offers import LOCAL_PLACEMENT, Placement
from spotbroker.broker.store.models import Attempt, Event, Job
from spotbroker.broker.teampolicy import limits

if TYPE_CHECKING:  # (the placer reads checkpoints through the agent channel, which ends attempts here)
    from spotbroker.broker.placement.placer import Placer

A, J, E = AttemptState, JobState, EndReason
TAIL_LINES = 20
TAIL_BYTES = 4096
def plan(placer: Placer, launching: Any, session: Session, job: Job, spec: JobSpec,
         gpu: Placement) -> tuple[JobSpec, tuple[Placement, ...], str] | str | None:
    """The pre-flight of a job the policy would launch on `gpu`: its spec (the
    trial's) and the places to try, as for any CPU job: the cheapest CPU
    place first (or the pre-flight's GPU; the broker's host where a CPU job
    would run there), and why. Says what it stands in for (`preflight_started`:
    the GPU place, priced, and the job's nodes). Only places within the
    team's limits (`limits.admits`) are tried: when none is, what the job
    waits for, as for its own run. None, the job FAILED, when no place can
    run it."""
    now, settings = launching.clock.now(), launching.settings
    flight = trial(spec)
    if on_host(flight, settings.cpu_jobs_on_host):
        places: tuple[Placement, ...] = (LOCAL_PLACEMENT,)
    else:
        choice = placer.choose(session, job, flight, now)
        chosen = choice.placements if choice and choice.action is Action.LAUNCH else ()
        policy = limits.policy_of(session, job)
        if chosen and not (within := tuple(p for p in chosen if limits.admits(p, flight, policy))):
            return reasons.WAITING_LIMIT + "its pre-flight: " + limits.over(chosen[0], flight, policy)
        places = launching.bounded(within) if chosen else ()
    if not places:
        transition(session, job, J.FAILED, reason="no_feasible_offer: no place can run its pre-flight",
                   data={"resources": flight.resources.model_dump(exclude_none=True)}, clock=launching.clock)
        return None
    session.add(Event(job_id=job.id, type=STARTED, at=now, data={
        "gpu_place": gpu.place, "gpu_instance_type": gpu.instance_type, "gpu_price_per_hour": gpu.price_per_hour,
        "num_nodes": spec.num_nodes}))
    return flight, places, f"pre-flight, before the job's run on {gpu.place} ({gpu.instance_type})"


def timeout_at(job: Job) -> datetime | None:
    """When the job's live pre-flight times out, if one runs."""
    attempt = next((a for a in job.attempts if a.preflight and a.state in LIVE_ATTEMPT_STATES), None)
    if attempt is None:
        return None
    return attempt.created_at + timedelta(seconds=spec_of(job).preflight.timeout)


def watch(session: Session, job: Job, clock: Clock) -> bool:
    """A launched job whose pre-flight runs: fail it once past its timeout,
    else look again then. False when no pre-flight runs."""
    due = timeout_at(job)
    if due is None:
        return False
    if clock.now() < due:
        job.next_check_at = due
        return True
    attempt = next(a for a in job.attempts if a.preflight and a.state in LIVE_ATTEMPT_STATES)
    attempt.released = False  # whatever still runs is stopped by the release phase
    timeout = spec_of(job).preflight.timeout
    transition(session, attempt, A.FAILED, reason=f"pre-flight timed out after {timeout} s", end=E.FAILED,
               clock=clock)
    _failed(session, job, attempt, f"timed out after {timeout} s", clock)
    return True


def ended(session: Session, job: Job, attempt: Attempt, status: RunStatus, clock: Clock) -> bool:
    """The pre-flight's run ended with an exit code: pass or fail the job."""
    attempt.exit_code = status.exit_code
    attempt.released = True  # the processes have exited
    if status.state == RunState.SUCCEEDED:
        transition(session, attempt, A.SUCCEEDED, reason="pre-flight passed", end=E.SUCCEEDED, clock=clock)
        data = _figures(session, job, attempt, clock.now())
        session.add(Event(job_id=job.id, attempt_id=attempt.id, type=PASSED, at=clock.now(), data=data))
        # (PREEMPTING: a notice came as it passed; its node is lost, not its verdict)
        transition(session, job, J.PENDING if job.state != J.PREEMPTING else J.RECOVERING,
                   data={"attempt_id": attempt.id, "preflight": "passed"}, clock=clock)
        job.reason = None
        job.next_check_at = clock.now()
        return True
    transition(session, attempt, A.FAILED, reason=f"pre-flight exit {status.exit_code}", end=E.FAILED, clock=clock)
    _failed(session, job, attempt, f"exit code {status.exit_code}", clock)
    return False


def _failed(session: Session, job: Job, attempt: Attempt, why: str, clock: Clock) -> None:
    data = {**_figures(session, job, attempt, clock.now()), "why": why, "tail": _tail(session, attempt.id)}
    session.add(Event(job_id=job.id, attempt_id=attempt.id, type=FAILED, at=clock.now(), data=data))
    transition(session, job, J.FAILED, reason=f"preflight_failed: {why}; no GPU was launched",
               data={"attempt_id": attempt.id}, clock=clock)


def _figures(session: Session, job: Job, attempt: Attempt, now: datetime) -> dict[str, Any]:
    """Its duration and cost, and what the GPU launch it stood in for would
    have cost over the same time."""
    began = attempt.started_at or attempt.created_at
    seconds = max(0.0, ((attempt.ended_at or now) - began).total_seconds())
    cost = job_costs(job, now, session).get(attempt.id, 0.0)
    out: dict[str, Any] = {"seconds": round(seconds, 3), "cost": round(cost, 6),
                           "instance_type": attempt.instance_type, "price_per_hour": attempt.price_per_hour}
    gpu = session.scalars(select(Event.data).where(Event.job_id == job.id, Event.type == STARTED)
                          .order_by(Event.id.desc()).limit(1)).first()
    if gpu:
        out.update({k: gpu[k] for k in ("gpu_place", "gpu_instance_type", "gpu_price_per_hour", "num_nodes")})
        out["gpu_would_have_cost"] = round(gpu["gpu_price_per_hour"] * seconds / 3600 * gpu["num_nodes"], 6)
    return out


def _tail(session: Session, attempt_id: int) -> str:
    """The last lines of the pre-flight's output (node 0's): the error."""
    start, end = logs.tail_start(session, attempt_id, 0, TAIL_LINES)
    start = max(start, end - TAIL_BYTES)
    return logs.read_from(session, attempt_id, 0, start, end - start).decode("utf-8", "replace")


def of_job(job: Job) -> dict[str, Any] | None:
    """What the job shows of its pre-flight: the newest pre-flight event's
    figures, with its outcome ("running" while one runs, "pending" before);
    None for a job without one (read through the job's own session)."""
    if not (job.spec or {}).get("preflight"):
        return None
    session = object_session(job)
    outcome = session.scalars(select(Event).where(Event.job_id == job.id, Event.type.in_((STARTED, PASSED, FAILED)))
                              .order_by(Event.id.desc()).limit(1)).first() if session is not None else None
    if outcome is None:
        return {"status": "pending"}
    status = {STARTED: "running", PASSED: "passed", FAILED: "failed"}[outcome.type]
    return {"status": status, "attempt_id": outcome.attempt_id, **(outcome.data or {})}
