"""Fixtures of the money tests."""
from __future__ import annotations

import pytest
from money.world import FakeClock, World


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def world(factory) -> World:
    return World(factory)
