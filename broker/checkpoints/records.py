"""What the database holds of a job's checkpoints: the rows the agent
channel records (broker/recovery/agent_channel.py) as each one is committed."""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from spotbroker.broker.store.models import Checkpoint


def newest_checkpoint(session: Session, job_id: int) -> Checkpoint | None:
    """The job's newest committed checkpoint (the highest step): what a new attempt resumes from."""
    return session.scalar(select(Checkpoint).where(Checkpoint.job_id == job_id)
                          .order_by(Checkpoint.step.desc(), Checkpoint.id.desc()).limit(1))
