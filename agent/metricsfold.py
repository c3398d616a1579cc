"""The trainer's metrics reports, folded on their way to the broker.

A trainer may call ``report()`` at every step; the broker needs a point
every few seconds at most. Reports that come within ``interval`` seconds of
the last one sent are folded into one pending report (the newest value of
each metric, at the newest step, with the newest early-stop standing: the
library's count over every report), which goes out once the interval has
passed, when the trainer exits, or at once when the standing first says
the rule is met. Bounded whatever the trainer writes: at most ``MAX_NAMES`` metrics,
names and values as the library cleans them.
"""
from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from spotbroker.agent.protocol import EARLY_STOP, METRICS

DEFAULT_INTERVAL = 3.0
MAX_NAMES = 32
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}\Z")


@dataclass(frozen=True)
class Report:
    step: int
    values: dict[str, float]
    standing: dict[str, Any] | None  # the early-stop rule's, as the library counted it

    def data(self) -> dict[str, Any]:
        return {"step": self.step, "values": self.values, **({EARLY_STOP: self.standing} if self.standing else {})}


def clean(data: dict[str, Any]) -> Report | None:
    """A metrics event as the broker takes it, or None."""
    step, values = data.get("step"), data.get("values")
    if not is_count(step) or not isinstance(values, dict):
        return None
    out = {k: float(v) for k, v in values.items() if isinstance(k, str) and NAME.match(k) and finite(v)}
    return Report(step, dict(list(out.items())[:MAX_NAMES]), standing(data.get(EARLY_STOP))) if out else None


def standing(value: Any) -> dict[str, Any] | None:
    """The library's early-stop standing, well-formed, or None."""
    if not isinstance(value, dict) or not is_count(value.get("best_step")) or not is_count(value.get("since")) \
            or not finite(value.get("best_value")):
        return None
    return {"best_step": value["best_step"], "best_value": float(value["best_value"]), "since": value["since"],
            "met": value.get("met") is True}


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


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
        self._pending: Report | None = None
        self._sent_at = -math.inf
        self._met_sent = False  # a report meeting the rule went at once: the next ones fold again
        self._lock = threading.Lock()

    def add(self, data: dict[str, Any]) -> None:
        report = clean(data)
        if report is None:
            return
        with self._lock:
            if self._pending is not None:
                self.folded += 1
                held = self._pending
                merged = {**held.values, **report.values}
                report = Report(max(held.step, report.step), dict(list(merged.items())[:MAX_NAMES]),
                                report.standing or held.standing)
            self._pending = report
        self.flush(force=bool(report.standing and report.standing["met"] and not self._met_sent))

    def flush(self, force: bool = True) -> None:
        """Send the pending report: now (`force`), or once the interval since the last has passed."""
        with self._lock:
            now = time.monotonic()
            if self._pending is None or (not force and now - self._sent_at < self.interval):
                return
            report, self._pending, self._sent_at = self._pending, None, now
            self._met_sent |= bool(report.standing and report.standing["met"])
            self.outbox.add(METRICS, report.data())
