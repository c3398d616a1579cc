"""A slow step that one team's calls hold until another team's has passed:
how a test shows that a team's work waits for its own, not for the places
every team shares (task-file parses, archive checks)."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class OtherTeamFirst:
    """Wraps `real`: a call of team `waiting` blocks (up to `timeout`) until a
    call of team `first` is done, then goes on. `stalled` counts the calls
    that waited in vain (`first` never came through); `peak` is each team's
    most calls at once."""

    def __init__(self, real: Callable, team_of: Callable[..., str], waiting: str = "ml", first: str = "cv",
                 timeout: float = 10) -> None:
        self.real, self.team_of, self.waiting, self.first, self.timeout = real, team_of, waiting, first, timeout
        self.stalled: list[str] = []
        self.peak: dict[str, int] = {}
        self._now: dict[str, int] = {}
        self._lock, self._first_done = threading.Lock(), threading.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        team = self.team_of(*args, **kwargs)
        with self._lock:
            self._now[team] = self._now.get(team, 0) + 1
            self.peak[team] = max(self.peak.get(team, 0), self._now[team])
        if team == self.waiting and not self._first_done.wait(self.timeout):
            self.stalled.append(team)
        with self._lock:
            self._now[team] -= 1
        if team == self.first:
            self._first_done.set()
        return self.real(*args, **kwargs)
