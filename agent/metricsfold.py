"""The trainer's metrics reports, folded on their way to the broker.

A trainer may call ``report()`` at every step; the broker needs a point
every few seconds at most. Reports that come within ``interval`` seconds of
the last one sent are folded into one pending report (the newest value of
each metric, at the newest step), which goes out once the interval has
passed, or when the trainer exits. Bounded whatever the trainer writes:
at most ``MAX_NAMES`` metrics, names and values as the library cleans them.
"""
from __future__ import annotations

import math
import re
import threading
import time
from typing import Any

from spotbroker.agent.protocol import METRICS

DEFAULT_INTERVAL = 3.0
MAX_NAMES = 32
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}\Z")


def clean(data: dict[str, Any]) -> tuple[int, dict[str, float]] | None:
    """(step, values) of a metrics event as the broker takes it, or None."""
    step, values = data.get("step"), data.get("values")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 2**63 or not isinstance(values, dict):
        return None
    out = {k: float(v) for k, v in values.items() if isinstance(k, str) and NAME.match(k) and finite(v)}
    return (step, dict(list(out.items())[:MAX_NAMES])) if out else None


def finite(value: Any) -> bool:
    """A number a float holds (an integer too large for one is not: the
    trainer may write any JSON, and this runs in the agent's event thread)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


class MetricsFolder:
    """Holds reports back to one per `interval` seconds; `add` and `flush` go to `outbox.add`."""

    def __init__(self, outbox: Any, interval: float = DEFAULT_INTERVAL) -> None:
        self.outbox = outbox
        self.interval = interval
        self.folded = 0  # reports merged into another, for the logs and tests
        self._pending: tuple[int, dict[str, float]] | None = None
        self._sent_at = -math.inf
        self._lock = threading.Lock()

    def add(self, data: dict[str, Any]) -> None:
        report = clean(data)
        if report is None:
            return
        with self._lock:
            if self._pending is not None:
                self.folded += 1
                step, values = self._pending
                merged = {**values, **report[1]}
                report = (max(step, report[0]), dict(list(merged.items())[:MAX_NAMES]))
            self._pending = report
        self.flush(force=False)

    def flush(self, force: bool = True) -> None:
        """Send the pending report: now (`force`), or once the interval since the last has passed."""
        with self._lock:
            now = time.monotonic()
            if self._pending is None or (not force and now - self._sent_at < self.interval):
                return
            step, values = self._pending
            self._pending, self._sent_at = None, now
            self.outbox.add(METRICS, {"step": step, "values": values})
