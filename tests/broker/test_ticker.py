"""The interval loop of the background duties (broker/ticker.py), and how a duty
failing turn after turn (the database out of reach) is told: in a few lines,
not a traceback a turn (45 s of a database outage was about 7,000 lines)."""
from __future__ import annotations

import logging
import threading
import time

from spotbroker.broker.ticker import Failures, run_every


def _loop(**kwargs) -> tuple[threading.Event, threading.Thread, list[float]]:
    stop, calls = threading.Event(), []
    started = time.monotonic()
    thread = threading.Thread(target=run_every, args=(stop, 60.0, lambda: calls.append(time.monotonic() - started)),
                              kwargs=kwargs, daemon=True)
    thread.start()
    return stop, thread, calls


def test_the_first_turn_waits_its_delay_unless_a_hint_comes_first():
    wake = threading.Event()
    stop, thread, calls = _loop(wake=wake, first_delay=60.0)
    time.sleep(0.3)
    assert calls == []                       # the money loop's first turn waits a step
    wake.set()                               # a hint (a budget changed): due now
    deadline = time.monotonic() + 5
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(calls) == 1 and calls[0] < 5
    stop.set()
    wake.set()
    thread.join(5)
    assert not thread.is_alive()


def test_a_stop_during_the_first_delay_ends_the_loop_without_a_turn():
    stop, thread, calls = _loop(first_delay=60.0)
    stop.set()
    thread.join(5)
    assert not thread.is_alive() and calls == []


def test_a_failure_repeated_is_told_once_then_a_line_a_minute_then_its_end(caplog):
    now = [0.0]
    failures = Failures(logging.getLogger("spotbroker.test"), "the pass", clock=lambda: now[0])

    def fail(message: str) -> None:
        try:
            raise ConnectionError(message)
        except ConnectionError:
            failures.failed()

    with caplog.at_level(logging.INFO, logger="spotbroker.test"):
        for _ in range(30):  # a turn every 2 s for a minute
            fail("connection refused")
            now[0] += 2
        fail("connection refused")
        fail("password authentication failed")  # another error: told whole
        now[0] += 10
        failures.succeeded()
        failures.succeeded()
    records = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert records == [
        ("ERROR", "the pass failed", True),
        ("ERROR", "the pass still failing: 31 times in 60 s, the last: ConnectionError: connection refused", False),
        ("ERROR", "the pass failed", True),
        ("WARNING", "the pass works again, after 70 s and 32 failures", False),
    ]
