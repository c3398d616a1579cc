"""Notifications through a local HTTP receiver (Slack's shape) and a local
SMTP server (aiosmtpd): once per condition with a resolve message; a
receiver that is down loses nothing and crashes nothing; a restarted broker
sends nothing twice."""
from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from aiosmtpd.controller import Controller
from money.world import KEYRING
from sqlalchemy import select

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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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
    ((to, mail),) = mailbox.got
    assert to == ["ops@example.com"] and "team ml: spend 50" in mail
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
    from spotbroker.broker.money.models import Budget, Notification
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
    with factory() as s:
        errors = {n.last_error for n in s.scalars(select(Notification))}
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
        errors = {n.last_error for n in s.scalars(select(Notification))}
    assert all("does not open: altered, or copied from elsewhere" in e for e in errors), errors
    assert not any("secretpart" in e for e in errors)
