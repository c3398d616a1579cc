"""The agent's one retry pause: exponential back-off with jitter.

Used by the broker delivery threads and the notice watchers alike. Standard
library only, so the supervisor can import it before the trainer runs.
"""
from __future__ import annotations

import random


def jittered_backoff(failures: int, initial: float, maximum: float, rng: random.Random | None = None) -> float:
    """The pause after `failures` failures in a row: doubling from `initial` up to
    `maximum`, then a random 50-100 % of that, so many nodes do not retry in step."""
    ceiling = min(maximum, initial * 2 ** max(0, failures - 1))
    return ceiling * (rng or random).uniform(0.5, 1.0)
