"""Leases on background duties: brokers sharing one database take turns, one
at a time, at a duty that must run in one of them (a price source's
refresh, the ledger's accrual, the alert pass, the cold tier, exporting the
deployment's metrics). A duty is one row of its area's lease table
(`price_source_leases`, `money_leases`), keyed by its name, with an owner,
an expiry and when it last ran: it is claimed only when due and not held,
and a dead holder's claim expires.

A job's row lease (`jobs.lease_owner`, `lease_expires_at`, claimed in
batches with `FOR UPDATE SKIP LOCKED` by the reconciler) is not this: it
hands out many rows of work at once, each to whoever gets it first, where
these hand out one duty.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import inspect, or_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.store.db import transaction


def claim(factory: sessionmaker[Session], table: type, name: str, owner: str, now: datetime, *,
          every_s: float | None, hold_s: float, renew: bool = False) -> tuple[bool, datetime | None]:
    """Take duty `name` of `table` until `now + hold_s`, if it is due (it
    last ran `every_s` ago or more, with a tenth of slack; None: due now)
    and no other broker holds it: (taken, when it last ran before, None the
    first time). `renew`: the holder may take it again before its claim
    expires (a duty held for as long as its broker lives)."""
    key = inspect(table).primary_key[0]
    with transaction(factory) as session:
        row = session.get(table, name)
        if row is None:
            try:
                with session.begin_nested():
                    session.add(table(**{key.key: name}))
            except IntegrityError:
                pass  # another broker added it first
            previous = None
        else:
            previous = row.last_run_at
        free = [table.expires_at.is_(None), table.expires_at < now, *([table.owner == owner] if renew else [])]
        where = [key == name, or_(*free)]
        if every_s is not None:
            due = now - timedelta(seconds=every_s * 0.9)
            where.append(or_(table.last_run_at.is_(None), table.last_run_at <= due))
        claimed = session.execute(update(table).where(*where).values(
            owner=owner, last_run_at=now, expires_at=now + timedelta(seconds=hold_s)))
        return claimed.rowcount == 1, previous


def release(factory: sessionmaker[Session], table: type, name: str, owner: str, **values) -> None:
    """Give duty `name` up, if `owner` still holds it; `values`: what else
    the area records of the run (a price source's last error)."""
    key = inspect(table).primary_key[0]
    with transaction(factory) as session:
        session.execute(update(table).where(key == name, table.owner == owner)
                        .values(owner=None, expires_at=None, **values))
