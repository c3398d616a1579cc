"""Fixtures of the money tests."""
from __future__ import annotations

import pytest
from support.coldfixtures import az_uri, azurite_endpoint, gcs_fake, gs_uri  # noqa: F401  (fixtures, found by name)
from support.s3fixtures import moto_endpoint, s3_uri  # noqa: F401  (fixtures, found by name)
from support.world import FakeClock, World


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def world(factory) -> World:
    return World(factory)
