"""Notifications through a local HTTP receiver (Slack's shape) and a local
SMTP server (aiosmtpd): once per condition with a resolve message; a
receiver that is down loses nothing and crashes nothing; a restarted broker
sends nothing twice."""
from __future__ import annotations

import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from aiosmtpd.controller import Controller
from sqlalchemy import select
from support.ports import free_port
from support.world import KEYRING

from spotbroker.broker.money import budgets
from spotbroker.broker.money.loop import MoneyLoop
from spotbroker.broker.money.settings import MoneySettings
from spotbroker.broker.settings import get_settings
from spotbroker.broker.store.db import transaction


class Receiver:
    """A webhook receiver that can be down (it answers 503) or gone (closed)."""

    def __init__(self) -> None:
        self.got: list[dict] = []
        self.down = False
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if outer.down:
                    self.send_response(503)
                else:
                    outer.got.append(json.loads(body))
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/T0/B0/secretpart"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Mailbox:
    def __init__(self) -> None:
        self.got: list = []

    async def handle_DATA(self, server, session, envelope):
        self.got.append((envelope.rcpt_tos, envelope.content.decode(errors="replace")))
        return "250 OK"


@pytest.fixture(autouse=True)
def local_receivers(monkeypatch):
    """The receivers here listen on loopback, which the broker reaches only when allowed."""
    monkeypatch.setenv("SPOTBROKER_NOTIFY_ALLOWED_NETWORKS", '["127.0.0.0/8"]')
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def mailbox():
    box = Mailbox()
    port = free_port()
    controller = Controller(box, hostname="127.0.0.1", port=port)
    controller.start()
    box.port = port
    yield box
    controller.stop()


def loop(factory, clock) -> MoneyLoop:
    """A broker's money loop, with the ledger accrued to now (as its tick does first)."""
    made = MoneyLoop(factory, MoneySettings(_env_file=None, notify_retry_seconds=1), clock=clock, keyring=KEYRING)
    made.accruer.accrue(clock.now())
    return made


def test_an_alert_reaches_the_webhook_and_the_mailbox_once_then_resolves(factory, world, clock, receiver, mailbox):
    team = world.team()
    body = budgets.BudgetIn.model_validate({"amount": 10.0, "period": "day", "targets": [
        {"name": "slack", "kind": "webhook", "url": receiver.url},
        {"name": "mail", "kind": "email", "smtp_url": f"smtp://127.0.0.1:{mailbox.port}", "to": ["ops@example.com"]}],
        "rules": {"thresholds": [50], "fast_burn": False, "slow_burn": False, "forecast": False,
                  "committed_hours": 0.001}})
    with transaction(factory) as s:
        budgets.put(s, team, body, clock, KEYRING)
    a = world.attempt(world.job(team), price=6.0, spot=False)
    clock.advance(minutes=60)
    result = loop(factory, clock).alert_pass(force=True)
    assert result.opened == 1 and result.sent == 2
    (hook,) = receiver.got
    assert set(hook) == {"text"} and "spend 50" in hook["text"] and "What to do" in hook["text"]
    assert f"\nFired at {clock.now():%Y-%m-%d %H:%M} UTC: " in hook["text"], hook["text"]  # when, if read late
    ((to, mail),) = mailbox.got
    assert to == ["ops@example.com"] and "team ml: spend 50" in mail
    # Dated by the alert, not the send, with an id of its own (RFC 5322 wants the date; clients sort by it).
    from email import message_from_string
    from email.utils import parsedate_to_datetime

    headers = message_from_string(mail)
    assert parsedate_to_datetime(headers["Date"]) == clock.now()
    assert re.fullmatch(r"<spotbroker\.notification\.\d+@localhost>",
                        headers["Message-ID"]), headers["Message-ID"]
    loop(factory, clock).alert_pass(force=True)              # still over 50 %: nothing new
    assert len(receiver.got) == 1 and len(mailbox.got) == 1
    world.end(a, clock.now())
    clock.advance(days=1)
    assert loop(factory, clock).alert_pass(force=True).resolved == 1
    assert "resolved" in receiver.got[-1]["text"] and len(receiver.got) == 2 and len(mailbox.got) == 2


def test_a_receiver_that_is_down_loses_nothing_and_a_restart_sends_nothing_twice(factory, world, clock, receiver):
    team = world.team()
    body = budgets.BudgetIn.model_validate({"amount": 10.0, "period": "day", "targets": [
        {"name": "slack", "kind": "webhook", "url": receiver.url}], "rules": {"thresholds": [50, 80]}})
    with transaction(factory) as s:
        budgets.put(s, team, body, clock, KEYRING)
    world.attempt(world.job(team), price=9.0, spot=False)
    clock.advance(minutes=60)
    receiver.down = True
    first = loop(factory, clock).alert_pass(force=True)
    assert first.opened >= 2 and first.sent == 0 and receiver.got == []
    clock.advance(seconds=0.5)                                # not due again yet
    assert loop(factory, clock).alert_pass(force=True).sent == 0
    receiver.down = False
    clock.advance(seconds=2)
    restarted = loop(factory, clock)                          # a new broker process
    assert restarted.alert_pass(force=True).sent == first.opened
    texts = [g["text"] for g in receiver.got]
    assert len(texts) == len(set(texts)) == first.opened
    clock.advance(minutes=5)
    loop(factory, clock).alert_pass(force=True)
    assert len(receiver.got) == first.opened                  # nothing sent twice


def test_a_target_that_does_not_open_fails_its_notification_saying_why(factory, world, clock, receiver):
    """A target sealed with a key this broker lacks, or altered, sends nothing
    and crashes nothing: its notification records why, never the URL."""
    from spotbroker.broker.store.moneymodels import Budget, Notification
    from spotbroker.broker.store.sealing import Keyring

    team = world.team()
    body = budgets.BudgetIn.model_validate({"amount": 10.0, "period": "day", "targets": [
        {"name": "slack", "kind": "webhook", "url": receiver.url}], "rules": {"thresholds": [50]}})
    stranger = Keyring.from_material([b"a key this broker does not have"])
    with transaction(factory) as s:
        budgets.put(s, team, body, clock, stranger)
    world.attempt(world.job(team), price=9.0, spot=False)
    clock.advance(minutes=60)
    result = loop(factory, clock).alert_pass(force=True)
    assert result.opened >= 1 and result.sent == 0 and receiver.got == []
    with factory() as s:  # the first says why; the newer ones wait behind it (a target's order)
        errors = {n.last_error for n in s.scalars(select(Notification))} - {None}
    assert errors == {f"webhook to slack cannot be sent: the target cannot be read: sealed with key "
                      f"{stranger.current}, which this broker does not have (SPOTBROKER_ENCRYPTION_KEYS must "
                      "list the key that sealed it)"}
    with transaction(factory) as s:  # altered in the database
        row = s.get(Budget, team)
        (target,) = row.targets
        row.targets = [{**target, "sealed": KEYRING.seal("{}", "budget target|team 999|slack")}]
        for n in s.scalars(select(Notification)):
            n.next_try_at = clock.now()
    assert loop(factory, clock).alert_pass(force=True).sent == 0 and receiver.got == []
    with factory() as s:
        head = s.scalars(select(Notification).order_by(Notification.id)).first()
        errors = {n.last_error for n in s.scalars(select(Notification))} - {None}
    assert "does not open: altered, or copied from elsewhere" in head.last_error, errors
    assert not any("secretpart" in e for e in errors)


PUBLIC = "93.184.215.14"  # a public address: what the target's name resolves to when it is checked


@pytest.fixture
def rebinding(monkeypatch):
    """DNS rebinding, with a resolver the test controls: a name under
    `rebind.example` resolves to a public address the first time it is asked
    and to loopback after. No loopback network is allowed; a connection to
    any address but loopback is refused and recorded (nothing reaches the
    network)."""
    monkeypatch.setenv("SPOTBROKER_NOTIFY_ALLOWED_NETWORKS", "[]")
    get_settings.cache_clear()
    asked: dict[str, int] = {}
    attempts: list[tuple[str, int]] = []
    real_getaddrinfo, real_create_connection = socket.getaddrinfo, socket.create_connection

    def getaddrinfo(host, port, *args, **kwargs):
        if isinstance(host, str) and host.endswith("rebind.example"):
            asked[host] = asked.get(host, 0) + 1
            address = PUBLIC if asked[host] == 1 else "127.0.0.1"
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port or 0)))]
        return real_getaddrinfo(host, port, *args, **kwargs)

    def create_connection(address, *args, **kwargs):
        if address[0] == PUBLIC:
            attempts.append((address[0], int(address[1])))
            raise ConnectionRefusedError(f"the test refuses {address[0]}")
        return real_create_connection(address, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    return attempts


def test_a_name_that_rebinds_to_loopback_after_the_check_is_not_reached(factory, world, clock, receiver, mailbox,
                                                                       rebinding):
    team = world.team()
    port = receiver.server.server_port
    body = budgets.BudgetIn.model_validate({"amount": 10.0, "period": "day", "targets": [
        {"name": "slack", "kind": "webhook", "url": f"http://hooks.rebind.example:{port}/services/T0/B0/x"},
        {"name": "mail", "kind": "email", "smtp_url": f"smtp://mail.rebind.example:{mailbox.port}",
         "to": ["ops@example.com"]}], "rules": {"thresholds": [50]}})
    with transaction(factory) as s:
        budgets.put(s, team, body, clock, KEYRING)
    world.attempt(world.job(team), price=9.0, spot=False)
    clock.advance(minutes=60)
    result = loop(factory, clock).alert_pass(force=True)
    assert result.opened >= 1
    assert receiver.got == [] and mailbox.got == [], "the broker reached its own host through a rebound name"
    assert result.sent == 0
    # It went where the name pointed when it was checked: the public address.
    assert set(rebinding) == {(PUBLIC, port), (PUBLIC, mailbox.port)}


def self_signed(tmp_path, name: str) -> tuple[str, str]:
    """(certificate, key) files of a self-signed certificate for `name`."""
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(minutes=1))
            .not_valid_after(now + timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_file), str(key_file)


@pytest.mark.parametrize("certified", ["hooks.tls.example", "someone-else.example"])
def test_an_https_hook_is_reached_at_the_checked_address_and_its_certificate_must_name_it(
        factory, world, clock, receiver, tmp_path, monkeypatch, certified):
    """The connection goes to the address checked, and TLS still verifies
    the hook's name: a certificate for another name is refused."""
    import ssl

    cert, key = self_signed(tmp_path, certified)
    monkeypatch.setenv("SSL_CERT_FILE", cert)  # the one authority this test trusts
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    receiver.server.socket = context.wrap_socket(receiver.server.socket, server_side=True)
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port, *a, **k: (
        [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))] if host == "hooks.tls.example"
        else real(host, port, *a, **k)))
    team = world.team()
    body = budgets.BudgetIn.model_validate({"amount": 10.0, "period": "day", "rules": {"thresholds": [50]}, "targets": [
        {"name": "slack", "kind": "webhook",
         "url": f"https://hooks.tls.example:{receiver.server.server_port}/services/T0/B0/x"}]})
    with transaction(factory) as s:
        budgets.put(s, team, body, clock, KEYRING)
    world.attempt(world.job(team), price=9.0, spot=False)
    clock.advance(minutes=60)
    result = loop(factory, clock).alert_pass(force=True)
    if certified == "hooks.tls.example":
        assert result.sent == result.opened >= 1 and len(receiver.got) == result.opened
    else:
        assert result.sent == 0 and receiver.got == []


class Drip:
    """A receiver that takes the request, then answers one byte at a time, a
    byte a second, for ever: within every read's own timeout."""

    def __init__(self, first: bytes) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port, self.first, self.stop = self.sock.getsockname()[1], first, threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(0.2)
            try:
                conn.recv(65536)
            except OSError:
                pass
            for byte in (self.first + b"X" * 100_000):
                if self.stop.wait(1.0):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.mark.parametrize("kind", ["webhook", "email"])
def test_a_receiver_that_drips_its_answer_is_cut_off_at_the_send_timeout(kind):
    """A byte a second, within each read's own timeout, held the money thread
    (every team's alerts, hard-cap stops and accrual) for as long as the
    receiver liked: 3 min 40 s in a probe, until it was killed."""
    import time

    from spotbroker.broker.money import notify

    drip = Drip(b"HTTP/1.1 200 OK\r\n" if kind == "webhook" else b"220 mail.example ESMTP\r\n")
    try:
        target = budgets.Target.model_validate(
            {"name": "slow", "kind": "webhook", "url": f"http://127.0.0.1:{drip.port}/hook"} if kind == "webhook"
            else {"name": "slow", "kind": "email", "smtp_url": f"smtp://127.0.0.1:{drip.port}", "to": ["a@b.c"]})
        started = time.monotonic()
        try:
            ok = notify.send(target, "title", "body", 3.0, ["127.0.0.0/8"])
        except Exception:
            ok = False
        assert not ok and time.monotonic() - started < 6, time.monotonic() - started
    finally:
        drip.close()


def test_a_target_gets_its_messages_in_the_order_they_were_written(factory, world, clock, receiver):
    """After an outage each message retried on its own back-off: the older "resolved"
    (tried more, due later) reached the channel after the newer "critical", so the
    channel's last word was that the cap was resolved while it was in force."""
    from datetime import timedelta

    from spotbroker.broker.money import notify
    from spotbroker.broker.store.moneymodels import Alert, Notification

    team = world.team()
    body = budgets.BudgetIn.model_validate({"amount": 10.0, "period": "day", "targets": [
        {"name": "slack", "kind": "webhook", "url": receiver.url}]})
    now = clock.now()
    with transaction(factory) as s:
        budgets.put(s, team, body, clock, KEYRING)
        alert = Alert(team_id=team, rule="hard_cap", severity="critical", summary="s", advice="a", fired_at=now)
        s.add(alert)
        s.flush()
        for kind, tries, due in (("resolve", 3, now + timedelta(seconds=8)), ("fire", 0, now)):
            s.add(Notification(alert_id=alert.id, team_id=team, target="slack", kind=kind, title=kind, body=kind,
                               tries=tries, next_try_at=due, created_at=now))
    settings = MoneySettings(_env_file=None)
    assert notify.deliver(factory, settings, now, keyring=KEYRING) == 0 and receiver.got == []
    assert notify.deliver(factory, settings, now + timedelta(seconds=9), keyring=KEYRING) == 2
    assert [g["text"].split("\n")[-1] for g in receiver.got] == ["resolve", "fire"], receiver.got
