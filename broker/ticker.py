"""The interval loop of the broker's background duties (broker/background.py)."""
from __future__ import annotations

import threading
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
