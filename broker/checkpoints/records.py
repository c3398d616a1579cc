"""What the database holds of a job's checkpoints: the rows the agent
channel records (broker/recovery/agent_channel.py) as each one is committed,
the newest of them (what a new attempt resumes from), and `keep`."""
from __future__ import annotations

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from spotbroker.broker.checkpoints.uris import CheckpointUnverified, attempt_prefix, checkpoint_uri, verify_and_keep
from spotbroker.broker.store.models import Checkpoint, Job, Team


def newest_checkpoint(session: Session, job_id: int) -> Checkpoint | None:
    """The job's newest committed checkpoint (the highest step): what a new attempt resumes from."""
    return session.scalar(select(Checkpoint).where(Checkpoint.job_id == job_id)
                          .order_by(Checkpoint.step.desc(), Checkpoint.id.desc()).limit(1))


class CheckpointNotFound(LookupError):
    pass


def committed(session: Session, job_id: int, limit: int | None = None,
              before: tuple[int, int] | None = None) -> list[Checkpoint]:
    """The job's committed checkpoints, newest step first: at most `limit`,
    those after (step, id) `before` in that order."""
    query = select(Checkpoint).where(Checkpoint.job_id == job_id)
    if before is not None:
        step, id_ = before
        query = query.where(or_(Checkpoint.step < step, and_(Checkpoint.step == step, Checkpoint.id < id_)))
    return list(session.scalars(query.order_by(Checkpoint.step.desc(), Checkpoint.id.desc()).limit(limit)))


def keep(session: Session, job: Job, checkpoint_id: int, checkpoint_root: str) -> Checkpoint:
    """Mark a checkpoint as the one to keep: its KEEP marker in the store
    stops any keep-last-K clean-up from deleting it. The marker goes where the
    broker's own layout puts that attempt's step (never where a stored URI
    says, if it says otherwise), and only once its manifest is read back
    there: else CheckpointUnverified, and nothing is written."""
    ckpt = session.scalar(select(Checkpoint).where(Checkpoint.id == checkpoint_id, Checkpoint.job_id == job.id))
    if ckpt is None:
        raise CheckpointNotFound(checkpoint_id)
    team = session.get(Team, job.team_id).name
    uri = checkpoint_uri(attempt_prefix(checkpoint_root, team, job.id, ckpt.attempt_id), ckpt.step)
    if ckpt.uri != uri:
        raise CheckpointUnverified(f"it is recorded at {ckpt.uri}, not at its attempt's own place {uri}")
    verify_and_keep(checkpoint_root, uri, ckpt.step)
    ckpt.keep = True
    return ckpt
