"""A duty failing turn after turn (the database out of reach) is told in a
few lines, not a traceback a turn: 45 s of a database outage was about
7,000 lines of one broker's log."""
from __future__ import annotations

import logging

from spotbroker.broker.ticker import Failures


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
