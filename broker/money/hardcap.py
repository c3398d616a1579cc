"""The hard cap: a team over its budget gets new jobs HELD with the reason
(recoveries too, when the budget says so), and, when the budget says
`stop_running`, its running jobs stopped and HELD (their checkpoints stay;
a released job recovers from the newest). Raising the budget releases them:
the reconciler looks at HELD jobs again, and a budget change makes it look
now. Every hold and stop is a state change with its event, and the
`hard_cap` alert (alerts.py) says so to the team's targets."""
from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.exc import StaleDataError

from spotbroker.broker.clock import Clock
from spotbroker.broker.jobs.states import (
    LIVE_ATTEMPT_STATES,
    RECLAIMED,
    AttemptState,
    EndReason,
    JobState,
    transition,
)
from spotbroker.broker.money import budgets
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Job
from spotbroker.broker.store.moneymodels import Budget

log = logging.getLogger("spotbroker.money")
RECHECK = timedelta(seconds=60)


# Launches that never ran: passed over to the attempt before them.
_NEVER_RAN = frozenset({EndReason.LAUNCH_ERROR, EndReason.NO_CAPACITY})


def budget_hold(session: Session, job: Job, clock: Clock) -> str | None:
    """The reconciler's question before it places a job: does the team's
    budget hold it? Only a recovery is let through where the budget allows
    recoveries: a job whose last run the cloud took back (or the broker
    moved), its failed launches since passed over. A restart after a failed
    exit, the GPU launch after a pre-flight and a job the cap itself stopped
    are new launches (each was let through over budget: `hold_new` launched
    an 8-GPU run after its pre-flight)."""
    ran = [a.end_reason for a in job.attempts if a.end_reason not in _NEVER_RAN]
    recovering = bool(ran) and (ran[-1] in RECLAIMED or ran[-1] == EndReason.MOVED)
    return budgets.hold_reason(session, job.team_id, recovering, clock.now())


def release_held(session: Session, team_id: int, now: datetime) -> int:
    """A budget changed: the team's HELD jobs are looked at on the next pass.
    The version moves too: a reconciler step that judged a job on the old
    budget meanwhile (and would put it off a whole interval) fails its
    write and looks again."""
    moved = session.execute(update(Job).where(Job.team_id == team_id, Job.state == str(JobState.HELD))
                            .values(next_check_at=now, version=Job.version + 1))
    return moved.rowcount or 0


def stop_running(factory: sessionmaker[Session], clock: Clock) -> int:
    """Stop the running jobs of teams over a `stop_running` budget; how many."""
    now = clock.now()
    with factory() as session:
        over = []
        for b in session.scalars(select(Budget).where(Budget.hard_cap_action == "stop_running")):
            reason = budgets.hold_reason(session, b.team_id, False, now)
            if reason is not None:
                over.append((b.team_id, reason))
        running = {team: list(session.scalars(select(Job.id).where(Job.team_id == team,
                                                                   Job.state == str(JobState.RUNNING))))
                   for team, _ in over}
    stopped = 0
    for team, reason in over:
        for job_id in running[team]:
            try:
                with transaction(factory) as session:
                    stopped += _stop(session, session.get(Job, job_id), reason, clock)
            except StaleDataError:
                pass  # the job moved meanwhile (an exit, a cancel): the next pass looks again
    return stopped


def _stop(session: Session, job: Job | None, reason: str, clock: Clock) -> bool:
    if job is None or job.state != JobState.RUNNING:
        return False
    for attempt in job.attempts:
        if attempt.state in LIVE_ATTEMPT_STATES:
            transition(session, attempt, AttemptState.CANCELLED, reason="stopped: over budget",
                       end=EndReason.CANCELLED, clock=clock)
    transition(session, job, JobState.HELD, reason=f"stopped, {reason}", clock=clock,
               data={"checkpoints": "kept"})
    job.next_check_at = clock.now() + RECHECK
    log.info("job %d stopped and held: %s", job.id, reason)
    return True
