"""Accrual: writes each attempt's cost to the ledger as it runs.

Every `SPOTBROKER_MONEY_ACCRUAL_INTERVAL` seconds (60 by default), one
broker (a lease in `money_leases`) appends, for every attempt that ran since
the last pass, the entries from how far it was accrued (`ledger_cursors`)
to the last whole interval of the grid before now (multiples of the
interval since the epoch), or, once it ended, to its end; an attempt that
ended is closed with its waste. So a running attempt's entries are at
most two intervals behind, and it gets exactly one usage row per interval
(1,440 a day at 60 s) however the passes fall against the grid, one more
where its spot price changed within one. A catch-up after downtime is cut
on the same grid, so burn windows stay exact. Readers add the unwritten
rest (`ledger.pending`; alerts, at the attempt's price, `alerts.gather`).

Each attempt's entries and its cursor move in one transaction, the cursor
only from the value read (a compare-and-set), so two brokers that both
think they hold the lease can never write the same minutes twice.
"""
from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.clock import SYSTEM_CLOCK, Clock
from spotbroker.broker.money import leases, ledger
from spotbroker.broker.money.settings import MoneySettings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Job
from spotbroker.broker.store.moneymodels import LedgerCursor, LedgerEntry

LEASE = "accrual"
CHUNK = 200
# Attempts that ended this long before the previous pass were seen by it.
_HORIZON = timedelta(hours=1)


@dataclass
class AccrualStats:
    attempts: int = 0
    entries: int = 0
    closed: int = 0
    conflicts: int = 0


class _Moved(Exception):
    """Another writer moved a cursor first: this chunk is dropped, the next pass redoes it."""


class Accruer:
    def __init__(self, factory: sessionmaker[Session], settings: MoneySettings, *, clock: Clock = SYSTEM_CLOCK,
                 owner: str | None = None) -> None:
        self.factory, self.settings, self.clock = factory, settings, clock
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"

    def pass_once(self) -> AccrualStats | None:
        """One pass if this broker gets the lease; None when another has it."""
        now = self.clock.now()
        taken, previous = leases.claim(self.factory, LEASE, self.owner, now,
                                       every_s=self.settings.accrual_interval, hold_s=self.settings.lease_seconds)
        if not taken:
            return None
        try:
            return self.accrue(now, None if previous is None else previous - _HORIZON)
        finally:
            leases.release(self.factory, LEASE, self.owner)

    def accrue(self, now: datetime, horizon: datetime | None = None) -> AccrualStats:
        """Write every open attempt's entries up to `now` (without the lease:
        tests and the benchmark call it directly)."""
        stats = AccrualStats()
        todo = self._open(horizon)
        for i in range(0, len(todo), CHUNK):
            try:
                with transaction(self.factory) as session:
                    for attempt, team_id, accrued_to in todo[i:i + CHUNK]:
                        self._one(session, attempt, team_id, accrued_to, now, stats)
            except (_Moved, IntegrityError):
                stats.conflicts += 1
        return stats

    def _open(self, horizon: datetime | None) -> list[tuple[Attempt, int, datetime | None]]:
        """Attempts with an open cursor, and started ones without a cursor
        (ended after `horizon`, when one is given)."""
        fresh = and_(LedgerCursor.attempt_id.is_(None), Attempt.started_at.is_not(None))
        if horizon is not None:
            fresh = and_(fresh, or_(Attempt.ended_at.is_(None), Attempt.ended_at >= horizon))
        with self.factory() as session:
            rows = session.execute(
                select(Attempt, Job.team_id, LedgerCursor.accrued_to)
                .join(Job, Job.id == Attempt.job_id)
                .outerjoin(LedgerCursor, LedgerCursor.attempt_id == Attempt.id)
                .where(or_(LedgerCursor.closed.is_(False), fresh))
                .order_by(Attempt.id)).all()
        return [tuple(r) for r in rows]

    def _one(self, session: Session, attempt: Attempt, team_id: int, accrued_to: datetime | None,
             now: datetime, stats: AccrualStats) -> None:
        step = self.settings.accrual_interval
        ended = attempt.ended_at is not None and attempt.ended_at <= now
        # A running attempt is written up to the last whole interval only
        # (readers add the rest): one row per interval, not two per pass.
        upto = now if ended else ledger.edge(now, step)
        if not ended and attempt.started_at is not None and upto <= (accrued_to or attempt.started_at):
            return
        drafts, reached, closing = ledger.pending(session, attempt, accrued_to, upto, step_s=step)
        if reached is None:
            return
        if drafts:
            session.execute(insert(LedgerEntry), [_row(d, attempt, team_id, now) for d in drafts])
        if accrued_to is None:
            session.execute(insert(LedgerCursor).values(attempt_id=attempt.id, team_id=team_id,
                                                        accrued_to=reached, closed=closing))
        else:
            moved = session.execute(update(LedgerCursor).where(
                LedgerCursor.attempt_id == attempt.id, LedgerCursor.accrued_to == accrued_to,
                LedgerCursor.closed.is_(False)).values(accrued_to=reached, closed=closing))
            if moved.rowcount != 1:
                raise _Moved()
        stats.attempts += 1
        stats.entries += len(drafts)
        stats.closed += closing

    # --- in the background ---------------------------------------------------------------


def _row(d: ledger.Draft, attempt: Attempt, team_id: int, now: datetime) -> dict:
    return {"team_id": team_id, "job_id": attempt.job_id, "attempt_id": attempt.id, "kind": d.kind,
            "start_at": d.start_at, "end_at": d.end_at, "node_hours": d.node_hours,
            "price_per_hour": d.price_per_hour, "amount": d.amount, "ondemand_amount": d.ondemand_amount,
            "wasted": d.wasted, "kwh": d.kwh, "co2e_kg": d.co2e_kg, "cloud": attempt.cloud, "region": attempt.region,
            "place": ledger.place(attempt),
            "accelerator": attempt.accelerator, "use_spot": attempt.use_spot, "note": None, "created_at": now}
