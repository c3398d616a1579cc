"""The money's background work in `serve`: one thread that, each tick,
accrues the ledger (when due, under its lease), then evaluates the budgets'
alerts, applies the hard cap's `stop_running` and delivers the outbox (when
due, under the alerting lease), then moves old checkpoints to the cold tier
(hourly, under its own lease). With several brokers on one database each
duty runs in one of them at a time. Time comes from the injected clock."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.checkpoints import coldtier
from spotbroker.broker.clock import SYSTEM_CLOCK, Clock
from spotbroker.broker.money import alerts, hardcap, leases, notify
from spotbroker.broker.money.accrual import Accruer
from spotbroker.broker.money.settings import MoneySettings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.sealing import Keyring
from spotbroker.broker.ticker import Failures, run_every

log = logging.getLogger("spotbroker.money")
LEASE = "alerts"
ARCHIVE_LEASE = "archive"


@dataclass
class AlertPass:
    opened: int = 0
    resolved: int = 0
    stopped: int = 0
    sent: int = 0


class MoneyLoop:
    def __init__(self, factory: sessionmaker[Session], settings: MoneySettings, *, clock: Clock = SYSTEM_CLOCK,
                 on_stopped: Callable[[], None] | None = None, keyring: Keyring | None = None) -> None:
        self.factory, self.settings, self.clock = factory, settings, clock
        self.keyring = keyring  # opens the notification targets (default: the broker settings')
        self.accruer = Accruer(factory, settings, clock=clock)
        self.owner = self.accruer.owner
        self.on_stopped = on_stopped     # jobs were stopped: the reconciler should release them now
        self._wake = threading.Event()
        self._failures = {name: Failures(log, f"money: {name}")
                          for name in ("pass_once", "alert_pass", "evaluate", "archive_pass")}

    def alert_pass(self, *, force: bool = False) -> AlertPass | None:
        """Evaluate, stop, deliver, if due and this broker gets the lease."""
        now = self.clock.now()
        taken, _ = leases.claim(self.factory, LEASE, self.owner, now,
                                every_s=0 if force else self.settings.alert_interval,
                                hold_s=self.settings.lease_seconds)
        if not taken:
            return None
        try:
            result = AlertPass()
            try:  # (each budget is its own savepoint; this is what all share: the spend, the open alerts)
                with transaction(self.factory) as session:
                    result.opened, result.resolved = alerts.evaluate(
                        session, now, timedelta(seconds=self.settings.alert_resolve_seconds))
                self._failures["evaluate"].succeeded()
            except Exception:  # the caps are still kept and what was queued still goes
                self._failures["evaluate"].failed()
            result.stopped = hardcap.stop_running(self.factory, self.clock)
            if result.stopped and self.on_stopped:
                self.on_stopped()
            result.sent = notify.deliver(self.factory, self.settings, self.clock.now(), keyring=self.keyring)
            return result
        finally:
            leases.release(self.factory, LEASE, self.owner)

    def archive_pass(self) -> coldtier.ArchiveStats | None:
        """Move checkpoints past the retention to the cold tier, if due and
        this broker gets the lease."""
        now = self.clock.now()
        taken, _ = leases.claim(self.factory, ARCHIVE_LEASE, self.owner, now, every_s=self.settings.archive_interval,
                                hold_s=max(self.settings.lease_seconds, 3600))
        if not taken:
            return None
        try:
            return coldtier.archive_due(self.factory, self.settings, now)
        finally:
            leases.release(self.factory, ARCHIVE_LEASE, self.owner)

    def tick(self) -> None:
        for duty in (self.accruer.pass_once, self.alert_pass, self.archive_pass):
            failures = self._failures[duty.__name__]
            try:
                duty()
                failures.succeeded()
            except Exception:  # a duty must never end the loop; its next turn carries on
                failures.failed()

    def hint(self) -> None:
        self._wake.set()

    def start(self, stop: threading.Event) -> threading.Thread:
        t = threading.Thread(target=self._loop, args=(stop,), name="money", daemon=True)
        t.start()
        return t

    def _loop(self, stop: threading.Event) -> None:
        # Wake often enough that each duty starts within a few seconds of
        # being due (each checks its own interval under its lease), and at
        # once on a hint (an outbox row to retry, a budget changed). The
        # first turn waits a step too: a broker's start has enough to do.
        step = max(0.05, min(5.0, self.settings.accrual_interval / 4, self.settings.alert_interval / 4,
                             self.settings.notify_retry_seconds))
        run_every(stop, step, self.tick, wake=self._wake, first_delay=step)
