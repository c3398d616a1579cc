"""The price tracker: each source refreshed on its own interval, in a
background thread of its own, so a slow cloud never delays another, the API
or the reconciler.

Brokers sharing one database take turns through a lease row per source
(`price_source_leases`, through broker/store/leases.py): a refresher stamps
itself owner until an expiry, and only when the source is due; the others
skip it. The network calls run
outside any transaction; the answer is then written in one.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.clock import SYSTEM_CLOCK, Clock
from spotbroker.broker.pricing import store
from spotbroker.broker.pricing.base import Source, SourceUnavailable
from spotbroker.broker.pricing.settings import PricingSettings
from spotbroker.broker.store import leases
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import PriceSourceLease
from spotbroker.broker.ticker import run_every

log = logging.getLogger("spotbroker.pricing")
_PRUNE_EVERY = timedelta(hours=1)


class PriceTracker:
    def __init__(self, factory: sessionmaker[Session], sources: dict[str, Source], settings: PricingSettings,
                 *, clock: Clock = SYSTEM_CLOCK, owner: str | None = None) -> None:
        self.factory, self.sources, self.settings, self.clock = factory, sources, settings, clock
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._said: dict[str, str] = {}      # the last unavailability logged per source
        # Why each source's last refresh here answered None, for a person
        # asking (`prices --refresh`): (kind, detail), kind one of
        # "unreachable", "failed", "held" (another broker has it).
        self.why_not: dict[str, tuple[str, str]] = {}
        self._pruned_at: datetime | None = None
        self._prune_lock = threading.Lock()

    # --- one refresh ---------------------------------------------------------------------

    def refresh(self, name: str, *, force: bool = False) -> store.RefreshResult | None:
        """Refresh one source if it is due (or `force`) and no other broker
        holds it; what changed, or None when skipped or unavailable."""
        now = self.clock.now()
        self.why_not.pop(name, None)
        if not self._claim(name, now, force):
            self.why_not[name] = ("held", "another broker is refreshing it now")
            return None
        error: str | None = None
        try:
            answer = self.sources[name].fetch()
            with transaction(self.factory) as session:
                result = store.apply_refresh(session, name, answer.rows, self.clock.now(), answer.scope,
                                             report=answer.report)
                result.risks = store.apply_risks(session, answer.risks)
            self._said.pop(name, None)
            log.info("prices %s", result.summary())
            return result
        except SourceUnavailable as exc:
            error = str(exc)
            self.why_not[name] = ("unreachable", error)
            if self._said.get(name) != error:  # once, not every interval
                log.warning("prices: %s skipped (%s); its offers keep their last prices", name, error)
                self._said[name] = error
            return None
        except Exception as exc:  # a refresh must never take the broker down
            error = f"{type(exc).__name__}: {exc}"
            self.why_not[name] = ("failed", error)
            log.warning("prices: %s refresh failed, previous prices kept: %s", name, error)
            return None
        finally:
            self._release(name, error)
            self._prune_if_due()

    def _claim(self, name: str, now: datetime, force: bool) -> bool:
        # Not renewed by its holder: a forced refresh in this process waits for the running one.
        taken, _ = leases.claim(self.factory, PriceSourceLease, name, self.owner, now,
                                every_s=None if force else self.settings.interval(name),
                                hold_s=self.settings.lease_seconds)
        return taken

    def _release(self, name: str, error: str | None) -> None:
        values = {"last_error": error}
        if error is None:
            values["last_ok_at"] = self.clock.now()
        leases.release(self.factory, PriceSourceLease, name, self.owner, **values)

    def _prune_if_due(self) -> None:
        now = self.clock.now()
        with self._prune_lock:
            if self._pruned_at is not None and now - self._pruned_at < _PRUNE_EVERY:
                return
            self._pruned_at = now
        with transaction(self.factory) as session:
            gone = store.prune_history(session, now, self.settings.retention_days)
        if gone:
            log.info("prices: %d history samples older than %g days removed", gone, self.settings.retention_days)

    def status(self) -> list[PriceSourceLease]:
        with self.factory() as session:
            return list(session.scalars(select(PriceSourceLease).order_by(PriceSourceLease.source)))

    # --- in the background ---------------------------------------------------------------

    def start(self, stop: threading.Event, *, first_delay: dict[str, float] | None = None) -> list[threading.Thread]:
        """One daemon thread per source; `first_delay` holds a source back at
        start (the snapshot was just loaded by the seed)."""
        threads = []
        for name in self.sources:
            t = threading.Thread(target=self._loop, args=(name, stop, (first_delay or {}).get(name, 0.0)),
                                 name=f"prices-{name}", daemon=True)
            t.start()
            threads.append(t)
        return threads

    def _loop(self, name: str, stop: threading.Event, delay: float) -> None:
        # Wake a few times per interval: another broker may hold the lease, or
        # have refreshed it a moment ago; `refresh` checks both.
        tick = max(1.0, min(60.0, self.settings.interval(name) / 5))
        run_every(stop, tick, lambda: self.refresh(name), first_delay=delay)
