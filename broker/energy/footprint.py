"""An attempt's power and grid, fixed at launch like its price.

The ledger multiplies each entry's node-hours by them (broker/money/ledger.py),
so energy and emissions are cut, corrected and summed exactly as dollars.
An agent that reads the GPUs' energy counters replaces the rated estimate
with the measured average (`record_measured`) for the minutes still to come.
"""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from spotbroker.broker.energy import grid, power
from spotbroker.broker.store.models import Attempt, Offer

ESTIMATED, MEASURED = "estimated", "measured"


def _shape(session: Session, attempt: Attempt) -> tuple[float | None, float | None]:
    """(vCPUs, memory GiB) of the attempt's instance type, from any price sample of it."""
    if attempt.instance_type is None:
        return None, None
    row = session.execute(select(Offer.vcpus, Offer.memory_gib)
                          .where(Offer.cloud == attempt.cloud, Offer.instance_type == attempt.instance_type)
                          .limit(1)).first()
    return (row.vcpus, row.memory_gib) if row is not None else (None, None)


def attach(session: Session, attempt: Attempt) -> None:
    """Fix the attempt's rated power per node and its region's grid intensity."""
    vcpus, memory = _shape(session, attempt)
    rated = power.estimate(attempt.cloud, attempt.accelerator, attempt.accelerator_count, vcpus, memory)
    figure = grid.intensity(attempt.cloud, attempt.region or "")
    attempt.power_kw = rated.kw
    attempt.grid_g_per_kwh = figure.g_per_kwh
    attempt.grid_source = figure.source[:64]
    attempt.energy_basis = ESTIMATED


def record_measured(session: Session, attempt: Attempt, gpu_joules: float, seconds: float) -> None:
    """The agent's NVML total for all the attempt's GPUs over `seconds` of running:
    from now on the ledger uses the measured average per node."""
    if seconds <= 0 or gpu_joules < 0:
        return
    vcpus, memory = _shape(session, attempt)
    nodes = max(attempt.num_nodes, 1)
    attempt.gpu_joules = gpu_joules
    attempt.power_kw = power.measured_kw(gpu_joules / nodes, seconds, attempt.cloud, vcpus, memory)
    attempt.energy_basis = MEASURED
