"""The grids' live carbon intensity, kept as history (`grid_readings`).

A pass asks Electricity Maps for the latest reading of each zone and keeps
each (zone, hour) once; brokers sharing a database may both ask, and the
second's rows are the same rows. Without a key nothing is asked and the
snapshot's figures stand. An attempt launched while its grid's newest
reading is fresh is charged at that reading (`fresh`).
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.energy import electricitymaps, grid
from spotbroker.broker.energy.settings import EnergySettings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import GridReading

log = logging.getLogger("spotbroker.energy")


def zones(settings: EnergySettings) -> list[str]:
    """The zones to read: the setting's, else every zone the snapshot maps a region to."""
    named = [z.strip() for z in settings.zones.split(",") if z.strip()]
    return sorted(set(named) or {v.zone for v in grid.snapshot().values() if v.zone})


def refresh(factory: sessionmaker[Session], settings: EnergySettings, now: datetime) -> int:
    """One pass: the readings newly kept (0, with one log line, when there is no key or no answer)."""
    if settings.electricitymaps_token is None:
        return 0
    client = electricitymaps.Client(settings.electricitymaps_token.get_secret_value(),
                                    settings.electricitymaps_url, settings.timeout)
    try:
        readings = client.latest(zones(settings))
    except electricitymaps.Unavailable as exc:
        log.warning("grid intensity not refreshed: %s; the last readings and the snapshot stand", exc)
        return 0
    kept = 0
    with transaction(factory) as session:
        for r in readings.values():
            if session.get(GridReading, (r.zone, r.at)) is not None:
                continue
            try:
                with session.begin_nested():
                    session.add(GridReading(zone=r.zone, at=r.at, g_per_kwh=r.g_per_kwh, estimated=r.estimated,
                                            source=electricitymaps.SOURCE, observed_at=now))
                kept += 1
            except IntegrityError:
                pass  # another broker kept it first
    return kept


def fresh(session: Session, zone: str | None, now: datetime, max_age_s: float) -> GridReading | None:
    """The zone's newest reading when it is no older than `max_age_s`."""
    if zone is None:
        return None
    return session.scalars(select(GridReading).where(
        GridReading.zone == zone, GridReading.at >= now - timedelta(seconds=max_age_s))
        .order_by(GridReading.at.desc()).limit(1)).first()
