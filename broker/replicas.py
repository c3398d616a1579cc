"""Brokers on one database must share their checkpoint root (where nodes
write checkpoints and fetch uploaded code, checked against it on every
commit), the address nodes report to, and their signing key (agent
tokens, dashboard sessions, sealed secrets). Each running broker keeps a
row here with the first two and a digest of the key, fresh while it runs;
a broker starting with a live broker's differing is refused at its start,
naming the setting (and both values, but for the key). Started apart, a
second root made every checkpoint of the jobs it launched be refused by
the others ("not this attempt's place") and their uploads unreachable; a
second address left its nodes "vanished" when it stopped; a second key
kept jobs with secrets HELD on the broker that could not open them.

The advertise address is compared only where one broker sets it: without
it, each broker is its nodes' address (and says so at its start).
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.clock import Clock
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import BrokerReplica
from spotbroker.broker.ticker import Failures

log = logging.getLogger("spotbroker")

BEAT_S = 15.0      # how often a running broker says it still runs
STALE_S = 60.0     # a row not refreshed this long is a broker gone (killed, its host lost)
FORGET_S = 86400.0  # a gone broker's row is deleted by the next broker to start after this long


@dataclass(frozen=True)
class Shared:
    """What brokers on one database must have alike."""

    checkpoint_root: str
    advertise_url: str | None
    signing_key_check: str | None = None

    @classmethod
    def of(cls, settings) -> Shared:
        return cls(settings.checkpoint_uri.rstrip("/"),
                   settings.advertise_url.rstrip("/") if settings.advertise_url else None,
                   key_check(settings.signing_key()))


def key_check(key: bytes) -> str:
    """What tells two signing keys apart and gives neither away (kept in the database)."""
    return hmac.new(key, b"spotbroker: brokers on one database sign with one key", hashlib.sha256).hexdigest()[:32]


def disagreements(session: Session, me: Shared, now: datetime, exclude: str | None = None) -> list[str]:
    """What a live broker has otherwise than `me`, a sentence each."""
    said: list[str] = []
    live = session.scalars(select(BrokerReplica).where(BrokerReplica.seen_at >= now - timedelta(seconds=STALE_S))
                           .order_by(BrokerReplica.started_at))
    for other in live:
        if other.id == exclude:
            continue
        # its id (host-pid-nonce) tells two brokers on one host apart
        there = f"the broker {other.id} on {other.host} (seen {(now - other.seen_at).total_seconds():.0f} s ago)"
        if other.checkpoint_root != me.checkpoint_root:
            said.append(f"SPOTBROKER_CHECKPOINT_ROOT is {me.checkpoint_root} here, {other.checkpoint_root} in "
                        f"{there}")
        if (me.advertise_url or other.advertise_url) and other.advertise_url != me.advertise_url:
            said.append(f"SPOTBROKER_ADVERTISE_URL is {me.advertise_url or 'unset'} here, "
                        f"{other.advertise_url or 'unset'} in {there}")
        if me.signing_key_check and other.signing_key_check and other.signing_key_check != me.signing_key_check:
            said.append(f"SPOTBROKER_SECRET_KEY differs here from {there}: the agent tokens, dashboard sessions and "
                        "secrets one signs or seals are refused by the other (unset, each broker makes its own "
                        "in its data directory: give them all the one key)")
    return list(dict.fromkeys(said))


class Registration:
    """This broker's row: written at its start, kept fresh, removed at its stop."""

    def __init__(self, factory: sessionmaker[Session], me: Shared, clock: Clock) -> None:
        self.factory, self.me, self.clock = factory, me, clock
        self.id = f"{socket.gethostname()[:40]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def join(self) -> None:
        now = self.clock.now()
        with transaction(self.factory) as session:
            # (a killed broker leaves its row: every restart of a crashing pod added one)
            session.execute(delete(BrokerReplica).where(BrokerReplica.seen_at < now - timedelta(seconds=FORGET_S)))
            session.add(BrokerReplica(id=self.id, host=socket.gethostname()[:255], started_at=now, seen_at=now,
                                      checkpoint_root=self.me.checkpoint_root, advertise_url=self.me.advertise_url,
                                      signing_key_check=self.me.signing_key_check))

    def keep(self, stop: threading.Event) -> None:
        """Refresh the row every BEAT_S until `stop`; then remove it."""
        said: set[str] = set()
        failures = Failures(log, "refreshing this broker's row")
        while not stop.wait(BEAT_S):
            try:
                with transaction(self.factory) as session:
                    session.execute(update(BrokerReplica).where(BrokerReplica.id == self.id)
                                    .values(seen_at=self.clock.now()))
                    # two started at once, each before the other's row: said here, once each
                    for line in disagreements(session, self.me, self.clock.now(), exclude=self.id):
                        if line.split(" (seen")[0] not in said:
                            said.add(line.split(" (seen")[0])
                            log.error("brokers on this database disagree: %s (docs/deploy.md)", line)
                failures.succeeded()
            except Exception:  # the database away a moment: the next beat tries again
                failures.failed()
        self.leave()

    def leave(self) -> None:
        try:
            with transaction(self.factory) as session:
                session.execute(delete(BrokerReplica).where(BrokerReplica.id == self.id))
        except Exception:  # it goes stale by itself
            log.exception("removing this broker's row failed")
