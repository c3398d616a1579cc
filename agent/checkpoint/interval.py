"""The broker's checkpoint interval, from the agent to the library.

The broker fits each attempt's interval to the zone's reclaim rate and the
measured checkpoint cost (or takes the job spec's fixed one) and answers it
to the agent (`checkpoint_interval_s`); the agent writes it to
``interval.json`` in the control directory (`agent/flush.py`),
and the library reads it at step boundaries (:class:`BrokerInterval`, a
stat at most every `POLL_S`). While it names a number of seconds, that is
the library's periodic interval instead of the trainer's own
``every_seconds`` (and, in one process, ``every_steps``): the spec decides,
not the code. ``null`` gives the trainer's own back. Adopting a new value
appends ``checkpoint_interval_adopted`` to ``events.jsonl``.
"""
from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spotbroker.agent import protocol

log = logging.getLogger("spotbroker.checkpoint")
POLL_S = 0.5


def interval_seconds(value: Any) -> float | None:
    """A usable interval (a positive finite number), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


class BrokerInterval:
    """The library's side: the broker's interval in force (None: the trainer's own)."""

    def __init__(self, control_dir: Path | None, emit: Callable[[str, dict[str, Any]], None],
                 code_seconds: float | None) -> None:
        self.path = control_dir / protocol.INTERVAL_FILE if control_dir is not None else None
        self.seconds: float | None = None
        self._emit = emit
        self._code_seconds = code_seconds
        self._mtime = 0
        self._polled = -math.inf

    def poll(self) -> float | None:
        if self.path is None:
            return None
        now = time.monotonic()
        if now - self._polled < POLL_S:
            return self.seconds
        self._polled = now
        try:
            mtime = self.path.stat().st_mtime_ns
            if mtime == self._mtime:
                return self.seconds
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return self.seconds
        self._mtime = mtime
        seconds = interval_seconds(doc.get("seconds")) if isinstance(doc, dict) else None
        if seconds != self.seconds:
            log.info("checkpoint interval: %s", f"{seconds:g} s, the broker's" if seconds else "the trainer's own")
            self._emit(protocol.INTERVAL_ADOPTED, {"seconds": seconds, "code_seconds": self._code_seconds})
            self.seconds = seconds
        return self.seconds
