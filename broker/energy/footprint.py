"""An attempt's power and grid, fixed at launch like its price.

The ledger multiplies each entry's node-hours by them (broker/money/ledger.py),
so energy and emissions are cut, corrected and summed exactly as dollars.
An agent that reads the GPUs' energy counters replaces the rated estimate
with the measured average (`record_measured`) for the minutes still to come.
"""
from __future__ import annotations

import math
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from spotbroker.agent import protocol
from spotbroker.broker.energy import grid, power, tracker
from spotbroker.broker.energy.settings import energy_settings
from spotbroker.broker.store.models import Attempt, Offer

ESTIMATED, MEASURED = "estimated", "measured"
# Above this a node's GPUs cannot draw (eight 1 kW boards, twice over): a
# report implying more is an agent's error, and the rating stays.
MAX_GPU_WATTS_PER_NODE = 16_000.0


def _shape(session: Session, attempt: Attempt) -> tuple[float | None, float | None]:
    """(vCPUs, memory GiB) of the attempt's instance type, from any price sample of it."""
    if attempt.instance_type is None:
        return None, None
    row = session.execute(select(Offer.vcpus, Offer.memory_gib)
                          .where(Offer.cloud == attempt.cloud, Offer.instance_type == attempt.instance_type)
                          .limit(1)).first()
    return (row.vcpus, row.memory_gib) if row is not None else (None, None)


def attach(session: Session, attempt: Attempt, now: datetime) -> None:
    """Fix the attempt's rated power per node and its region's grid intensity:
    the grid's live reading when a fresh one is kept, else the snapshot's."""
    vcpus, memory = _shape(session, attempt)
    rated = power.estimate(attempt.cloud, attempt.accelerator, attempt.accelerator_count, vcpus, memory)
    attempt.power_kw = rated.kw
    attempt.grid_g_per_kwh, attempt.grid_source = grid_now(session, attempt.cloud, attempt.region, now)
    attempt.energy_basis = ESTIMATED


def grid_now(session: Session, cloud: str, region: str | None, now: datetime) -> tuple[float, str]:
    """(g CO2e/kWh, its source) that an attempt launched in the region now is
    charged at (placement weighs the same figure, broker/placement/carbon.py)."""
    figure = grid.intensity(cloud, region or "")
    live = tracker.fresh(session, figure.zone, now, energy_settings().reading_max_age)
    if live is None:
        return figure.g_per_kwh, figure.source[:64]
    return live.g_per_kwh, f"{live.source} {live.zone} {live.at:%Y-%m-%dT%H:%MZ}"[:64]


def record_report(session: Session, attempt: Attempt, data: dict) -> None:
    """An agent event's measured energy (node 0's, standing for every node of the attempt)."""
    joules, seconds = data.get(protocol.GPU_JOULES), data.get(protocol.GPU_SECONDS)
    if isinstance(joules, int | float) and isinstance(seconds, int | float) and not isinstance(joules, bool):
        try:
            joules, seconds = float(joules), float(seconds)
        except OverflowError:  # an integer no float holds: no reading
            return
        record_measured(session, attempt, joules * max(attempt.num_nodes, 1), seconds)


def record_measured(session: Session, attempt: Attempt, gpu_joules: float, seconds: float) -> None:
    """The agent's NVML total for all the attempt's GPUs over `seconds` of running:
    from now on the ledger uses the measured average per node."""
    if not (math.isfinite(gpu_joules) and math.isfinite(seconds)) or seconds <= 0 or gpu_joules < 0:
        return
    nodes = max(attempt.num_nodes, 1)
    if gpu_joules / nodes / seconds > MAX_GPU_WATTS_PER_NODE:
        return
    vcpus, memory = _shape(session, attempt)
    attempt.gpu_joules = gpu_joules
    attempt.power_kw = power.measured_kw(gpu_joules / nodes, seconds, attempt.cloud, vcpus, memory)
    attempt.energy_basis = MEASURED
