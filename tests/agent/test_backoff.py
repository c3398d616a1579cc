"""The one retry pause of the agent (broker delivery and notice watchers)."""
from __future__ import annotations

import random

from spotbroker.agent.backoff import jittered_backoff


def test_backoff_doubles_up_to_its_maximum_with_jitter():
    rng = random.Random(1)
    for failures in range(12):
        ceiling = min(5.0, 0.2 * 2 ** max(0, failures - 1))  # 0.2, 0.2, 0.4, 0.8 ... 5.0
        delays = [jittered_backoff(failures, 0.2, 5.0, rng) for _ in range(200)]
        assert all(ceiling / 2 <= delay <= ceiling for delay in delays)
        assert max(delays) - min(delays) > ceiling / 4  # spread: nodes do not retry in step
    assert jittered_backoff(30, 0.2, 5.0) <= 5.0  # the module's own generator by default


def test_backoff_follows_the_generator_it_is_given():
    assert jittered_backoff(4, 0.5, 5.0, random.Random(7)) == jittered_backoff(4, 0.5, 5.0, random.Random(7))
