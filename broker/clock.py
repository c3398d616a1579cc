"""Time, injected: code that needs "now" takes a Clock, so tests travel in
time instead of sleeping."""
from __future__ import annotations

from datetime import UTC, datetime


class Clock:
    def now(self) -> datetime:
        return datetime.now(UTC)


SYSTEM_CLOCK = Clock()
