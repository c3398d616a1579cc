"""Leases of the money's background duties (accrual, alerting): brokers
sharing one database take turns, one at a time, as the price tracker does
with its sources (broker/pricing/tracker.py). A duty is claimed only when
due and not held; a dead holder's claim expires."""
from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import or_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.money.models import MoneyLease
from spotbroker.broker.store.db import transaction


def claim(factory: sessionmaker[Session], name: str, owner: str, now: datetime, *, every_s: float,
          hold_s: float) -> tuple[bool, datetime | None]:
    """Take the duty if it is due: (taken, when it last ran before, None the
    first time). Not taken when another broker holds it or ran it recently."""
    with transaction(factory) as session:
        row = session.get(MoneyLease, name)
        if row is None:
            try:
                with session.begin_nested():
                    session.add(MoneyLease(name=name))
            except IntegrityError:
                pass  # another broker added it first
            previous = None
        else:
            previous = row.last_run_at
        due = now - timedelta(seconds=every_s * 0.9)
        claimed = session.execute(update(MoneyLease).where(
            MoneyLease.name == name,
            or_(MoneyLease.expires_at.is_(None), MoneyLease.expires_at < now, MoneyLease.owner == owner),
            or_(MoneyLease.last_run_at.is_(None), MoneyLease.last_run_at <= due),
        ).values(owner=owner, last_run_at=now, expires_at=now + timedelta(seconds=hold_s)))
        return claimed.rowcount == 1, previous


def release(factory: sessionmaker[Session], name: str, owner: str) -> None:
    with transaction(factory) as session:
        session.execute(update(MoneyLease).where(MoneyLease.name == name, MoneyLease.owner == owner)
                        .values(owner=None, expires_at=None))
