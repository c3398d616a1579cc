"""Fixtures of the money tests."""
from __future__ import annotations

import pytest
from money.world import FakeClock, World
from s3fixtures import moto_endpoint, s3_uri  # noqa: F401  (fixtures, found by name)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def world(factory) -> World:
    return World(factory)
