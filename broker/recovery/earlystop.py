"""Early stopping: a run whose reported metric stopped improving ends, and
its best weights are kept.

    metrics -> the job's early_stop rule judged over its reports, across attempts -> fired:
      an `early_stop` row and event; the agent's answers say `stop: true`
    the library checkpoints (reason early_stop): the best checkpoint is kept -> the trainer
      leaves its loop (trainer_exited) -> the attempt and the job end SUCCEEDED, reason
      `early_stopped`; the agent is told to cancel what is left
    no library, or no stop within the agent's window (`no_flush`), or nothing at all for
      STOP_GRACE_S (an older agent) -> the same ending, from what is committed

The rule counts reports from `min_steps` on: the best so far, and how many
came since that did not beat it by more than `min_delta`; `patience` of
them fire it. The trainer's library counts (it sees every report, where the
agent folds them on their way here) and each report carries its standing
(`agent/checkpoint/reports.py`); the broker fires on the newest. A resumed
run counts on from its checkpoint, as the library keeps the count in it.

The kept checkpoint is the one the library saved at the best step (reason
`best`): a report that beat it after the rule fired, while the stop was on
its way, saved one too, but judges nothing. Without one (the upload was
busy, or the trainer saved none), the first committed at or after the best
step, nearest to the best weights. It is marked `keep` (never deleted nor
archived) and named in the job, with how it was chosen.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from spotbroker.agent import protocol
from spotbroker.agent.metricsfold import is_count, standing
from spotbroker.broker.checkpoints.uris import CheckpointUnverified, verify_and_keep
from spotbroker.broker.clock import Clock
from spotbroker.broker.jobs import metrics
from spotbroker.broker.jobs.states import LIVE_ATTEMPT_STATES, AttemptState, EndReason, JobState, transition
from spotbroker.broker.jobs.stoprule import EarlyStopRule
from spotbroker.broker.store.metricmodels import EarlyStop
from spotbroker.broker.store.models import Attempt, Checkpoint, Event, Job

STOP_GRACE_S = 300.0  # past the agent's own window (30 s): a job whose agent never answers the stop
FIRED = "early_stop"  # the broker's event: the rule fired
BEST = "best"         # the library's reason for a checkpoint at an improving report
AFTER_BEST = "after_best"
KEEP_REFUSED = "keep_refused"  # the broker's event: the chosen checkpoint did not verify in storage


@dataclass(frozen=True)
class Verdict:
    best_step: int
    best_value: float
    step: int      # the newest report judged
    since: int     # reports since the best that did not beat it


def judge(reports: list[tuple[dict[str, Any], datetime]], rule: EarlyStopRule) -> Verdict | None:
    """The rule over a batch of `metrics` events (data, the agent's time), in
    order: a verdict at the first whose standing, as the library counted it,
    reaches patience (a backlog may hold reports from after it)."""
    for data, _ in reports:
        counted = standing(data.get(protocol.EARLY_STOP))
        if counted is not None and is_count(data.get("step")) and counted["since"] >= rule.patience:
            return Verdict(counted["best_step"], counted["best_value"], data["step"], counted["since"])
    return None


def rule_of(job: Job) -> EarlyStopRule | None:
    doc = (job.spec or {}).get("early_stop")
    return EarlyStopRule.model_validate(doc) if doc else None


def pending(session: Session, job: Job) -> EarlyStop | None:
    """The job's fired rule, while the job has not yet ended for it."""
    if "early_stop" not in (job.spec or {}):
        return None
    row = session.get(EarlyStop, job.id)
    return row if row is not None and row.finished_at is None else None


def after_metrics(session: Session, job: Job, attempt: Attempt, reports: list[tuple[dict[str, Any], datetime]],
                  clock: Clock) -> bool:
    """Judge the rule on new reports of the job's running attempt; whether it fired now."""
    rule = rule_of(job)
    if rule is None or job.state != JobState.RUNNING or attempt.state not in LIVE_ATTEMPT_STATES:
        return False
    if session.get(EarlyStop, job.id) is not None:
        return False
    verdict = judge(reports, rule)
    if verdict is None:
        return False
    session.add(EarlyStop(job_id=job.id, attempt_id=attempt.id, metric=rule.metric, decided_at=clock.now(),
                          step=verdict.step, best_step=verdict.best_step, best_value=verdict.best_value))
    session.add(Event(job_id=job.id, attempt_id=attempt.id, type=FIRED, at=clock.now(), data={
        "metric": rule.metric, "mode": rule.mode, "best_step": verdict.best_step, "best_value": verdict.best_value,
        "step": verdict.step, "reports_since_best": verdict.since, "patience": rule.patience}))
    return True


def stop_wanted(session: Session, job: Job, attempt: Attempt) -> bool:
    """Should the attempt's agent be told `stop`?"""
    return attempt.state in LIVE_ATTEMPT_STATES and pending(session, job) is not None


def on_agent_event(session: Session, job: Job, attempt: Attempt, kind: str, data: dict[str, Any],
                   clock: Clock, root: str | None) -> bool:
    """The stop's course, told by the agent (or its silence); whether the job ended.

    The early_stop commit keeps the best checkpoint; the job ends when the
    trainer has left its loop (`trainer_exited`), so that nothing is killed
    under it; without a library (`no_flush`) or past STOP_GRACE_S, at once."""
    row = pending(session, job)
    if row is None or job.state != JobState.RUNNING or attempt.state not in LIVE_ATTEMPT_STATES:
        return False
    if kind == protocol.CHECKPOINT_COMMITTED and data.get("reason") == protocol.EARLY_STOP:
        step = data.get("step")
        row.stopped_step = step if isinstance(step, int) and not isinstance(step, bool) else None
        _keep_best(session, job, row, clock, root)
        return False
    if kind == protocol.TRAINER_EXITED or (kind == protocol.NO_FLUSH and data.get(protocol.EARLY_STOP)) \
            or clock.now() - row.decided_at > timedelta(seconds=STOP_GRACE_S):
        finish(session, job, attempt, row, clock, root)
        return True
    return False


def on_run_ended(session: Session, job: Job, attempt: Attempt, clock: Clock) -> bool:
    """The launcher saw the run end while its stop was pending: the job ends for it
    (a checkpoint not kept yet is marked in the database; the storage's marker is
    left to the keep API)."""
    row = pending(session, job)
    if row is None or job.state != JobState.RUNNING:
        return False
    finish(session, job, attempt, row, clock, None)
    attempt.released = True  # its processes have exited
    return True


def finish(session: Session, job: Job, attempt: Attempt, row: EarlyStop, clock: Clock, root: str | None) -> None:
    """End the attempt and the job SUCCEEDED (early_stopped), the best checkpoint kept."""
    if row.checkpoint_id is None:
        _keep_best(session, job, row, clock, root)
    if row.stopped_step is None:
        row.stopped_step = _newest_step(session, job.id, row.metric)
    row.finished_at = clock.now()
    if attempt.state in LIVE_ATTEMPT_STATES:
        transition(session, attempt, AttemptState.SUCCEEDED, reason=protocol.EARLY_STOPPED, end=EndReason.SUCCEEDED,
                   clock=clock)
        attempt.released = False  # the release phase stops what is left of the run
    transition(session, job, JobState.SUCCEEDED, reason=protocol.EARLY_STOPPED, clock=clock, data={
        "attempt_id": attempt.id, "best_step": row.best_step, "stopped_step": row.stopped_step,
        "checkpoint_id": row.checkpoint_id, "checkpoint_choice": row.checkpoint_choice})


def _keep_best(session: Session, job: Job, row: EarlyStop, clock: Clock, root: str | None) -> None:
    session.flush()  # the commit just reported is a row to choose from
    kept, choice = choose_checkpoint(session, job.id, row.best_step)
    if kept is None:
        return
    row.checkpoint_id, row.checkpoint_choice = kept.id, choice
    if root is not None:
        try:
            verify_and_keep(root, kept.uri, kept.step)
        except CheckpointUnverified as exc:  # named all the same; not kept, as the keep API would not
            session.add(Event(job_id=job.id, attempt_id=kept.attempt_id, type=KEEP_REFUSED, at=clock.now(),
                              data={"checkpoint_id": kept.id, "reason": str(exc)}))
            return
    kept.keep = True


def choose_checkpoint(session: Session, job_id: int, best_step: int) -> tuple[Checkpoint | None, str | None]:
    best = session.scalar(select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.reason == BEST,
                                                   Checkpoint.step == best_step)
                          .order_by(Checkpoint.committed_at.desc(), Checkpoint.id.desc()).limit(1))
    if best is not None:
        return best, BEST
    after = session.scalar(select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.step >= best_step)
                           .order_by(Checkpoint.step, Checkpoint.id.desc()).limit(1))
    return (after, AFTER_BEST) if after is not None else (None, None)


def _newest_step(session: Session, job_id: int, metric: str) -> int | None:
    points = metrics.curve(session, job_id, metric)
    return points[-1][0] if points else None


def summary(session: Session | None, job: Job, dollars_run: float, now: datetime) -> dict[str, Any] | None:
    """What the job's early stop did and saved, for the job's view; None when the rule has not fired."""
    row = session.get(EarlyStop, job.id) if session is not None and "early_stop" in (job.spec or {}) else None
    if row is None:
        return None
    hours_run = sum(((a.ended_at or now) - a.started_at).total_seconds() / 3600
                    for a in job.attempts if a.started_at is not None)
    out: dict[str, Any] = {
        "metric": row.metric, "best_step": row.best_step, "best_value": row.best_value, "fired_at": row.decided_at,
        "fired_at_step": row.step, "stopped_step": row.stopped_step, "done": row.finished_at is not None,
        "hours_run": round(hours_run, 6), "dollars_run": round(dollars_run, 6),
        "hours_saved": None, "dollars_saved": None, "checkpoint": None,
    }
    kept = session.get(Checkpoint, row.checkpoint_id) if row.checkpoint_id else None
    if kept is not None:
        out["checkpoint"] = {"id": kept.id, "step": kept.step, "uri": kept.uri, "choice": row.checkpoint_choice}
    attempt = session.get(Attempt, row.attempt_id)
    estimate = (job.spec or {}).get("estimated_hours")
    if estimate is None:
        out["saving"] = "no estimated_hours: no saving can be computed (the hours and dollars run so far are shown)"
        return out
    price = attempt.price_per_hour * attempt.num_nodes if attempt is not None else 0.0
    saved_hours = max(float(estimate) - hours_run, 0.0)
    out.update(hours_saved=round(saved_hours, 4), dollars_saved=round(saved_hours * price, 6),
               saving=f"{saved_hours:.2f} h not run of estimated_hours {float(estimate):g}, at ${price:.4f}/h "
                      "(the price in force when it stopped)")
    return out
