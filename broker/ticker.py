"""The interval loop of the broker's background duties (broker/background.py)."""
from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable


def run_every(stop: threading.Event, seconds: float, work: Callable[[], None], *,
              wake: threading.Event | None = None, first_delay: float = 0.0) -> None:
    """Call `work` after `first_delay`, then every `seconds`, until `stop`
    is set; a set `wake` calls it at once (a hint: something is due now).
    `work` keeps its own errors: one failed turn must not end the loop. A
    duty that sets `wake` must be woken when `stop` is set, to notice it."""
    if wake is None:
        stop.wait(first_delay)
    elif wake.wait(first_delay):  # a hint ends the first wait too
        wake.clear()
    while not stop.is_set():
        work()
        if wake is None:
            stop.wait(seconds)
        else:
            wake.wait(seconds)
            wake.clear()


class Failures:
    """A duty's failures, told without flooding the log: the first with its
    traceback, the same error again at most once every `every_s` in one
    line with how often it came, and the recovery. A database out of reach
    for 45 s was about 7,000 lines: a traceback every turn of every duty."""

    def __init__(self, log: logging.Logger, what: str, every_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.what, self.every_s, self.clock = log, what, every_s, clock
        self.since: float | None = None
        self.told_at, self.count, self.last = 0.0, 0, ""

    def failed(self) -> None:
        """Called in the `except` block of the failed turn."""
        exc = sys.exc_info()[1]
        said = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        now = self.clock()
        self.count += 1
        if self.since is None or said != self.last:
            self.log.exception("%s failed", self.what)
            self.since = now if self.since is None else self.since
            self.told_at, self.last = now, said
        elif now - self.told_at >= self.every_s:
            self.log.error("%s still failing: %d times in %.0f s, the last: %s", self.what, self.count,
                           now - self.since, said)
            self.told_at = now

    def succeeded(self) -> None:
        if self.since is not None:
            self.log.warning("%s works again, after %.0f s and %d failures", self.what, self.clock() - self.since,
                             self.count)
            self.since, self.count, self.last = None, 0, ""
