"""A job's energy as its readers show it (the API, the CLI, the job page):
kWh and CO2e from the ledger (written entries plus the unwritten tail, as
its dollars), per attempt with the power and grid figures they were
charged at, and per unit of training progress where the job reported it.

Progress: the highest step the trainer reported (`ckpt.report`) or a
checkpoint reached, and the highest value of a metric named `epoch` (the
epochs done, as a trainer counts them). Each is the job's over all its
attempts, so a resumed job's energy per step counts the steps it redid.
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from spotbroker.broker.money.views import Money
from spotbroker.broker.store.metricmodels import MetricPoint
from spotbroker.broker.store.models import Attempt, Checkpoint

EPOCH = "epoch"   # the metric name a trainer reports its epoch under: ckpt.report(step, epoch=3)


@dataclass(frozen=True)
class Progress:
    steps: int | None    # the highest step reported or checkpointed; None: none
    epochs: float | None  # the highest `epoch` reported; None: none


def progress(session: Session, job_id: int) -> Progress:
    """How far the job's training got, from its metrics and checkpoints (one
    statement, on the (job_id, ...) indexes of both)."""
    checkpointed = select(func.max(Checkpoint.step)).where(Checkpoint.job_id == job_id).scalar_subquery()
    metric_step, epochs, checkpoint_step = session.execute(
        select(func.max(MetricPoint.step), func.max(MetricPoint.value).filter(MetricPoint.name == EPOCH),
               checkpointed).where(MetricPoint.job_id == job_id)).one()
    steps = max((s for s in (metric_step, checkpoint_step) if s is not None), default=None)
    return Progress(steps=steps, epochs=epochs)


def per(kwh: float, units: float | None, scale: float = 1.0) -> float | None:
    """kWh per `scale` units of progress; None when the progress is unknown or none."""
    if units is None or units <= 0:
        return None
    return round(kwh / units * scale, 6)


def attempt_energy(a: Attempt, m: Money | None) -> dict:
    """An attempt's energy so far and the figures it is charged at."""
    return {"kwh": round(m.kwh if m else 0.0, 6), "co2e_kg": round(m.co2e_kg if m else 0.0, 6),
            "power_kw": a.power_kw, "grid_g_per_kwh": a.grid_g_per_kwh, "grid_source": a.grid_source,
            "basis": a.energy_basis}


def job_energy(session: Session, job_id: int, money: dict[int, Money]) -> dict:
    """The job's energy so far, and per 1,000 steps and per epoch where known."""
    kwh = sum(m.kwh for m in money.values())
    co2e = sum(m.co2e_kg for m in money.values())
    reached = progress(session, job_id) if money else Progress(None, None)
    return {"kwh": round(kwh, 6), "co2e_kg": round(co2e, 6), "kwh_per_1000_steps": per(kwh, reached.steps, 1000),
            "kwh_per_epoch": per(kwh, reached.epochs)}
