"""What the reconciler does with a launch that SkyPilot follows after the
launch call returned (see `launcher.py`): a launch still in flight is left
alone; a refusal for capacity ends the attempt NO_CAPACITY and places the
job again at once, the refused zone now in the placement history.

The synchronous launchers raise `CapacityError` from `launch`; this is the
same ending, reported one or more passes later by `status`.
"""
from __future__ import annotations

from sqlalchemy.orm import Session

from spotbroker.broker import recovery
from spotbroker.broker.clock import Clock
from spotbroker.broker.launch.base import RunState, RunStatus
from spotbroker.broker.models import Attempt, Job
from spotbroker.broker.states import LIVE_ATTEMPT_STATES


def observed(session: Session, job: Job, attempt_id: int, status: RunStatus, placer, clock: Clock) -> bool | None:
    """None when `status` is not one of these (the caller goes on); else
    whether the reconciler should look at the job now."""
    if status.state == RunState.PENDING:
        return False
    if not status.capacity:
        return None
    attempt = session.get(Attempt, attempt_id)
    if attempt is None or attempt.state not in LIVE_ATTEMPT_STATES:
        return False
    attempt.released = False  # the release phase downs its cluster (a failed launch leaves it INIT)
    if recovery.capacity_refused(session, job, attempt, status.error or "no capacity", clock, last=True,
                                 retry_after_s=0):
        placer.capacity_error(attempt, clock.now())
    return True
