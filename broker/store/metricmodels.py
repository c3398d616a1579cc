"""The tables of a job's metrics and its early stop (migration 0019).

`metric_points`: what the trainer reported (`ckpt.report`), per attempt, at
most `MAX_POINTS_PER_ATTEMPT` rows, `MAX_POINTS_PER_JOB` a job, of at most `MAX_NAMES` names (the
bounds are `broker/jobs/metrics.py`'s). `early_stops`: a job whose
`early_stop` rule fired, when and where, and the checkpoint kept for it.
"""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Float, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from spotbroker.broker.store.db import Base
from spotbroker.broker.store.models import BigId


class MetricPoint(Base):
    __tablename__ = "metric_points"
    __table_args__ = (Index("ix_metric_points_job_id_name_step", "job_id", "name", "step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(BigInteger)
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)
    at: Mapped[datetime]  # the agent's time of the report


class EarlyStop(Base):
    """The job's early_stop rule fired (one row a job)."""

    __tablename__ = "early_stops"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    metric: Mapped[str] = mapped_column(String(64))
    decided_at: Mapped[datetime]
    step: Mapped[int] = mapped_column(BigInteger)        # the newest report when it fired
    best_step: Mapped[int] = mapped_column(BigInteger)
    best_value: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[datetime | None]                 # the job ended for it
    stopped_step: Mapped[int | None] = mapped_column(BigInteger)  # the step the trainer stopped at
    # The checkpoint kept for the best weights, and how it was chosen ("best": saved at the
    # best report; "after_best": the newest committed at or after it).
    checkpoint_id: Mapped[int | None] = mapped_column(ForeignKey("checkpoints.id", ondelete="SET NULL"))
    checkpoint_choice: Mapped[str | None] = mapped_column(String(16))
