"""The interval loop of the background duties (broker/ticker.py)."""
from __future__ import annotations

import threading
import time

from spotbroker.broker.ticker import run_every


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
