"""Leases of the money's background duties (accrual, alerting, the cold
tier, the deployment's metrics): rows of `money_leases`, taken through the
broker's one lease helper (broker/store/leases.py), as the price tracker's
sources are. A duty's holder may renew its own claim."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.store import leases
from spotbroker.broker.store.moneymodels import MoneyLease


def claim(factory: sessionmaker[Session], name: str, owner: str, now: datetime, *, every_s: float,
          hold_s: float) -> tuple[bool, datetime | None]:
    """Take the duty if it is due: (taken, when it last ran before, None the
    first time). Not taken when another broker holds it or ran it recently."""
    return leases.claim(factory, MoneyLease, name, owner, now, every_s=every_s, hold_s=hold_s, renew=True)


def release(factory: sessionmaker[Session], name: str, owner: str) -> None:
    leases.release(factory, MoneyLease, name, owner)
