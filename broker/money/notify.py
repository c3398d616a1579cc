"""Delivering the outbox: each queued notification is sent to its target (a
Slack-compatible webhook gets a JSON `{"text": ...}` POST; email goes through
the target's SMTP server), outside any transaction, and marked sent after.
A failure is retried with a doubling delay; a receiver that is down loses
nothing (the row waits), and a broker that restarts sends nothing twice (a
sent row is never picked again; the delivering broker holds the alerting
lease).

Where a message goes is checked where it is sent: the target's host is
resolved once, every address it resolves to is checked
(`broker/money/addresses.py`), and the connection is made to those very
addresses, never to a name resolved again. So a name that pointed somewhere
public when the budget was set, or when it was checked a moment ago, cannot
lead the broker to its own host or a metadata service (DNS rebinding). TLS
still verifies the name. Redirects are not followed.

Targets are read from their sealed form only here (and for the admin's
hint); one that does not open fails its notification, saying why. Secrets
stay out of logs and of `last_error`: errors name the target and its hint.
"""
from __future__ import annotations

import email.utils
import json
import logging
import smtplib
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from urllib.parse import unquote, urlsplit

import httpcore
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.money import addresses as where
from spotbroker.broker.money import budgets
from spotbroker.broker.money.settings import MoneySettings
from spotbroker.broker.settings import get_settings
from spotbroker.broker.store import sealing
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.moneymodels import Budget, Notification
from spotbroker.broker.store.sealing import Keyring, SealError

log = logging.getLogger("spotbroker.money")
_MAX_DELAY_S = 3600.0


class Refused(Exception):
    """The target's host may not be reached (or does not resolve): why."""


def checked_addresses(host: str, port: int, allowed_networks: Iterable[str]) -> list[str]:
    """The addresses `host` resolves to, every one of them allowed; Refused
    says why not. The caller connects to these, and only these."""
    allowed = list(allowed_networks)
    problem = where.host_problem(host, allowed)
    if problem:
        raise Refused(problem)
    literal = where.literal_address(host)
    if literal is not None:
        return [str(literal)]
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise Refused(f"{host} does not resolve") from None
    addresses: list[str] = []
    for *_, sockaddr in found:
        address = where.literal_address(str(sockaddr[0]).split("%")[0])
        problem = where.address_problem(address, allowed) if address else f"{sockaddr[0]} is not an address"
        if problem:
            raise Refused(problem)
        if str(address) not in addresses:
            addresses.append(str(address))
    if not addresses:
        raise Refused(f"{host} does not resolve")
    return addresses


class _Deadline:
    """The whole of one send, bounded: each connection it opens is shut down
    when its time is up. A read or a write has its own timeout, and a
    receiver that answered a byte within each held the one money thread (every
    team's alerts, hard-cap stops and accrual) as long as it liked."""

    def __init__(self, seconds: float) -> None:
        self._sockets: list[socket.socket] = []
        self._expired = False
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *_) -> None:
        self._timer.cancel()

    def watch(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets.append(sock)
            if self._expired:
                _shut(sock)
        return sock

    def _expire(self) -> None:
        with self._lock:
            self._expired = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # (a blocked read returns at once; close() would not wake it)
    except OSError:
        pass


def _connect(addresses: Sequence[str], port: int, timeout: float | None, deadline: _Deadline) -> socket.socket:
    """A TCP connection to the first of the checked addresses that answers."""
    error: OSError = OSError("no address")
    for address in addresses:
        try:
            return deadline.watch(socket.create_connection((address, port), timeout))
        except OSError as exc:
            error = exc
    raise error


class _CheckedAddresses(httpcore.SyncBackend):
    """httpcore's network backend, connecting to the checked addresses
    whatever the URL's name (httpcore still gives TLS that name to verify)."""

    def __init__(self, addresses: Sequence[str], deadline: _Deadline) -> None:
        self.addresses, self.deadline = addresses, deadline

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        error: Exception = httpcore.ConnectError("no address")
        for address in self.addresses:
            try:
                stream = super().connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
                continue
            self.deadline.watch(stream.get_extra_info("socket"))
            return stream
        raise error


def _tls():
    """httpx's TLS context (certifi's roots), imported when a notification goes out:
    a broker starts without httpx (and the rich and pygments it imports)."""
    import httpx

    return httpx.create_ssl_context()


def _post_webhook(url: str, text: str, addresses: Sequence[str], timeout: float, deadline: _Deadline) -> bool:
    body = json.dumps({"text": text}).encode()  # Slack's shape: the message under "text", nothing else
    with httpcore.ConnectionPool(ssl_context=_tls(),
                                 network_backend=_CheckedAddresses(addresses, deadline)) as pool, \
            pool.stream("POST", url, content=body, headers={"Content-Type": "application/json",
                                                              "User-Agent": "spotbroker"},
                        extensions={"timeout": dict.fromkeys(("connect", "read", "write", "pool"), timeout)}) \
            as response:
        return 200 <= response.status < 300  # (its body is not read: only the status says anything)


class _SMTP(smtplib.SMTP):
    """SMTP to the checked addresses (STARTTLS, if used, verifies the name)."""

    def __init__(self, addresses: Sequence[str], host: str, port: int, timeout: float, deadline: _Deadline) -> None:
        self.addresses, self.deadline = addresses, deadline
        super().__init__(host, port, timeout=timeout)

    def _get_socket(self, host, port, timeout):
        return _connect(self.addresses, port, timeout, self.deadline)


class _SMTPS(smtplib.SMTP_SSL):
    """SMTP over TLS to the checked addresses; the certificate must name the host."""

    def __init__(self, addresses: Sequence[str], host: str, port: int, timeout: float, deadline: _Deadline) -> None:
        self.addresses, self.deadline = addresses, deadline
        super().__init__(host, port, timeout=timeout, context=_tls())

    def _get_socket(self, host, port, timeout):
        return self.context.wrap_socket(_connect(self.addresses, port, timeout, self.deadline),
                                        server_hostname=self._host)


def _send_mail(target: budgets.Target, title: str, body: str, addresses: Sequence[str], timeout: float,
               deadline: _Deadline, written: datetime | None, ident: str | None) -> bool:
    u = urlsplit(target.smtp_url)
    # A server named by its address gives no mail domain: say "localhost".
    domain = u.hostname if any(c.isalpha() for c in u.hostname) else "localhost"
    message = EmailMessage()
    message["Subject"], message["From"] = title, target.sender or f"spotbroker@{domain}"
    message["To"] = ", ".join(target.to)
    # When it happened (a retried message is dated by its event, not its send) and one id
    # whatever the tries: mail clients sort and thread by them, spam filters want both.
    message["Date"] = email.utils.format_datetime(written or datetime.now(UTC))
    message["Message-ID"] = f"<{ident or email.utils.make_msgid().strip('<>').split('@')[0]}@{domain}>"
    message.set_content(body)
    smtp_class = _SMTPS if u.scheme == "smtps" else _SMTP
    with smtp_class(addresses, u.hostname, u.port or (465 if u.scheme == "smtps" else 25), timeout, deadline) as smtp:
        if u.username:
            smtp.login(unquote(u.username), unquote(u.password or ""))
        smtp.send_message(message)
    return True


def send(target: budgets.Target, title: str, body: str, timeout: float, allowed_networks: Iterable[str],
         written: datetime | None = None, ident: str | None = None) -> bool:
    """Send one message to the target, connecting only to addresses checked
    now, in at most `timeout` seconds in all; Refused when its host may not
    be reached. `written`, `ident`: an email's Date and Message-ID's own part."""
    u = urlsplit(target.url if target.kind == "webhook" else target.smtp_url)
    default_port = {"https": 443, "http": 80, "smtps": 465, "smtp": 25}[u.scheme]
    addresses = checked_addresses(target.host, u.port or default_port, allowed_networks)
    with _Deadline(timeout) as deadline:
        if target.kind == "webhook":
            return _post_webhook(target.url, f"*{title}*\n{body}", addresses, timeout, deadline)
        return _send_mail(target, title, body, addresses, timeout, deadline, written, ident)


PASS_SENDS = 3  # one pass of deliveries spends at most this many sends' timeouts


def deliver(factory: sessionmaker[Session], settings: MoneySettings, now: datetime, limit: int = 200,
            allowed_networks: Iterable[str] | None = None, keyring: Keyring | None = None) -> int:
    """Send what is due; how many went out. Each target gets its messages in
    the order they were written: one waits while an older one to the same
    target is still to be sent (each retries on its own back-off, and after
    an outage "resolved: hard cap" reached a channel after the newer
    "critical: hard cap"). `allowed_networks` and `keyring`: default, the
    broker's (SPOTBROKER_NOTIFY_ALLOWED_NETWORKS, its keys)."""
    if allowed_networks is None:
        allowed_networks = get_settings().notify_allowed_networks
    with factory() as session:
        unsent = list(session.scalars(select(Notification).where(
            Notification.sent_at.is_(None), Notification.tries < settings.notify_max_tries)
            .order_by(Notification.id).limit(limit)))
        stored = {b.team_id: {t.name: t for t in budgets.targets(b)} for b in session.scalars(
            select(Budget).where(Budget.team_id.in_({n.team_id for n in unsent})))} if unsent else {}
    queues: dict[tuple[int, str], list[Notification]] = {}
    for n in unsent:
        queues.setdefault((n.team_id, n.target), []).append(n)
    if unsent and keyring is None:
        keyring = sealing.keyring(get_settings())
    sent, started = 0, time.monotonic()
    for queue in queues.values():
        for n in queue:
            if n.next_try_at > now or time.monotonic() - started > PASS_SENDS * settings.notify_timeout:
                break  # not due yet (nor the newer ones), or slow receivers: the rest go out next pass
            error = _send_one(n, stored.get(n.team_id, {}).get(n.target), keyring, settings, allowed_networks)
            _record(factory, settings, n, now, error)
            if error is not None:
                break
            sent += 1
    return sent


def _send_one(n: Notification, saved: budgets.StoredTarget | None, keyring: Keyring, settings: MoneySettings,
              allowed_networks: Iterable[str]) -> str | None:
    """Why the notification did not go, or None when it went."""
    if saved is None:
        return "the target is no longer in the budget"
    try:
        target = saved.open(keyring)
    except SealError as exc:
        return f"{saved.kind} to {saved.name} cannot be sent: the target cannot be read: {exc}"
    try:
        ok = send(target, n.title, n.body, settings.notify_timeout, allowed_networks,
                  n.created_at.replace(tzinfo=UTC), f"spotbroker.notification.{n.id}")
    except Refused as exc:
        return f"{target.kind} to {target.name} refused: {exc}"
    except Exception as exc:  # a sender must never end the loop
        ok = False
        log.warning("notification %d to %s failed: %s", n.id, n.target, type(exc).__name__)
    return None if ok else f"{target.kind} to {target.hint()} failed"


def _record(factory: sessionmaker[Session], settings: MoneySettings, n: Notification, now: datetime,
            error: str | None) -> None:
    with transaction(factory) as session:
        row = session.get(Notification, n.id)
        if row is None or row.sent_at is not None:
            return
        row.tries += 1
        if error is None:
            row.sent_at, row.last_error = now, None
            return
        row.last_error = error
        delay = min(settings.notify_retry_seconds * 2 ** (row.tries - 1), _MAX_DELAY_S)
        row.next_try_at = now + timedelta(seconds=delay)
        if row.tries >= settings.notify_max_tries:
            log.warning("notification %d to %s given up after %d tries: %s", n.id, n.target, row.tries, error)
