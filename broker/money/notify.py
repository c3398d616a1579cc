"""Delivering the outbox: each queued notification is sent to its target
with apprise (a Slack-compatible webhook gets a JSON `{"text": ...}` POST;
email goes through the target's SMTP server), outside any transaction,
and marked sent after. A failure is retried with a doubling delay; a
receiver that is down loses nothing (the row waits), and a broker that
restarts sends nothing twice (a sent row is never picked again; the
delivering broker holds the alerting lease).

Before a notification goes, its host is resolved and every address it
resolves to is checked (`budgets.address_problem`): a name that pointed
somewhere public when the budget was set may point at the broker's own
host or a metadata service now. (apprise resolves it again to connect: a
name that changes in between is not caught; an operator who fears that
lists no private network and routes the broker's egress through a proxy.)

Targets are read from their sealed form only here (and for the admin's
hint); one that does not open fails its notification, saying why. Secrets
stay out of logs and of `last_error`: apprise's own logging is quietened,
and errors are recorded as the target's name and hint.
"""
from __future__ import annotations

import logging
import socket
from collections.abc import Iterable
from datetime import datetime, timedelta
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.money import budgets
from spotbroker.broker.money.models import Budget, Notification
from spotbroker.broker.money.settings import MoneySettings
from spotbroker.broker.settings import get_settings
from spotbroker.broker.store import sealing
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.sealing import Keyring, SealError

log = logging.getLogger("spotbroker.money")
logging.getLogger("apprise").setLevel(logging.CRITICAL)  # it logs URLs, which are secrets here
_MAX_DELAY_S = 3600.0


def apprise_url(target: budgets.Target) -> str:
    """The apprise URL that reaches the target."""
    if target.kind == "webhook":
        u = urlsplit(target.url)
        query = [(f"-{k}", v) for k, v in parse_qsl(u.query)]  # the hook's own query, passed through
        # Slack's shape: the message under "text", nothing else.
        query += [(":message", "text"), (":version", ""), (":title", ""), (":attachments", ""), (":type", "")]
        return f"{'jsons' if u.scheme == 'https' else 'json'}://{u.netloc}{u.path or '/'}?{urlencode(query)}"
    u = urlsplit(target.smtp_url)
    auth = ""
    if u.username:
        auth = quote(u.username, safe="") + (f":{quote(u.password, safe='')}" if u.password else "") + "@"
    port = f":{u.port}" if u.port else ""
    # A server named by its address gives no mail domain: say "localhost".
    domain = u.hostname if any(c.isalpha() for c in u.hostname) else "localhost"
    params = {"from": target.sender or f"spotbroker@{domain}", "to": ",".join(target.to),
              "mode": "ssl" if u.scheme == "smtps" else "insecure"}
    return f"{'mailtos' if u.scheme == 'smtps' else 'mailto'}://{auth}{u.hostname}{port}?{urlencode(params)}"


def destination_problem(target: budgets.Target, allowed_networks: Iterable[str]) -> str | None:
    """Why the target may not be reached now, or None (an unresolvable name
    is left to the sender, which fails on it)."""
    allowed = list(allowed_networks)
    host = target.host
    problem = budgets.host_problem(host, allowed)
    if problem or budgets.literal_address(host) is not None:
        return problem
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    for *_, sockaddr in found:
        address = budgets.literal_address(str(sockaddr[0]).split("%")[0])
        problem = budgets.address_problem(address, allowed) if address else None
        if problem:
            return problem
    return None


def send(target: budgets.Target, title: str, body: str, timeout: float) -> bool:
    import apprise

    asset = apprise.AppriseAsset(async_mode=False)
    a = apprise.Apprise(asset=asset)
    url = apprise_url(target)
    if target.kind == "webhook":
        url += f"&cto={timeout}&rto={timeout}"
    if not a.add(url):
        return False
    text = body if target.kind == "email" else f"*{title}*\n{body}"
    return bool(a.notify(title=title, body=text))


def deliver(factory: sessionmaker[Session], settings: MoneySettings, now: datetime, limit: int = 200,
            allowed_networks: Iterable[str] | None = None, keyring: Keyring | None = None) -> int:
    """Send what is due; how many went out. `allowed_networks` and `keyring`:
    default, the broker's (SPOTBROKER_NOTIFY_ALLOWED_NETWORKS, its keys)."""
    if allowed_networks is None:
        allowed_networks = get_settings().notify_allowed_networks
    with factory() as session:
        due = list(session.scalars(select(Notification).where(
            Notification.sent_at.is_(None), Notification.tries < settings.notify_max_tries,
            Notification.next_try_at <= now).order_by(Notification.id).limit(limit)))
        stored = {b.team_id: {t.name: t for t in budgets.targets(b)} for b in session.scalars(
            select(Budget).where(Budget.team_id.in_({n.team_id for n in due})))} if due else {}
    if due and keyring is None:
        keyring = sealing.keyring(get_settings())
    sent = 0
    for n in due:
        error = _send_one(n, stored.get(n.team_id, {}).get(n.target), keyring, settings, allowed_networks)
        _record(factory, settings, n, now, error)
        sent += error is None
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
    if refused := destination_problem(target, allowed_networks):
        return f"{target.kind} to {target.name} refused: {refused}"
    try:
        ok = send(target, n.title, n.body, settings.notify_timeout)
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
