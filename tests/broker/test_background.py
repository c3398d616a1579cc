"""The broker's background work comes from one list (broker/background.py):
the app starts exactly those threads, routers none, and none outlives it."""
from __future__ import annotations

import asyncio
import threading

import pytest

from spotbroker.api.app import create_app


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate()}


def _running(app) -> set[str]:
    async def run() -> set[str]:
        async with app.router.lifespan_context(app):
            return _threads()

    return asyncio.run(run())


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_app_runs_the_listed_duties_and_stops_them_all(settings):
    before = _threads()
    app = create_app(settings)
    assert _running(app) - before == {"replica", "reconciler", "prices-catalog", "money", "local-runs"}
    assert _threads() - before == set()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_without_its_reconciler_the_app_runs_the_other_duties(settings):
    before = _threads()
    assert _running(create_app(settings, run_reconciler=False)) - before == {"replica", "prices-catalog", "money",
                                                                              "local-runs"}
    assert _threads() - before == set()


def test_no_router_has_a_lifespan_of_its_own():
    """A router that started work in its lifespan would start it beside the list."""
    import importlib
    import pkgutil

    from spotbroker.api import routers

    for info in pkgutil.iter_modules(routers.__path__):
        router = getattr(importlib.import_module(f"{routers.__name__}.{info.name}"), "router", None)
        if router is not None:
            assert type(router.lifespan_context).__name__ == "_DefaultLifespan", info.name


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_with_an_electricity_maps_key_the_grids_live_readings_are_kept(settings, monkeypatch):
    from sqlalchemy import func, select
    from support.emapsfake import ElectricityMapsFake
    from support.helpers import wait_for

    from spotbroker.broker.energy.settings import energy_settings
    from spotbroker.broker.store.db import make_engine, make_session_factory
    from spotbroker.broker.store.models import GridReading

    fake = ElectricityMapsFake("operator-key")
    for name, value in (("ELECTRICITYMAPS_TOKEN", "operator-key"), ("ELECTRICITYMAPS_URL", fake.url),
                        ("ZONES", "DE,FR"), ("REFRESH_INTERVAL", "4")):
        monkeypatch.setenv(f"SPOTBROKER_ENERGY_{name}", value)
    energy_settings.cache_clear()
    before = _threads()
    app = create_app(settings, run_reconciler=False)

    async def run() -> set[str]:
        async with app.router.lifespan_context(app):
            factory = make_session_factory(make_engine(settings.sqlalchemy_url))
            wait_for(lambda: factory().scalar(select(func.count()).select_from(GridReading)) == 2, 30,
                     what="the two zones' readings")
            return _threads()

    try:
        assert "grid-intensity" in asyncio.run(run()) - before
        assert _threads() - before == set()
        assert {token for _, token in fake.seen} == {"operator-key"}
    finally:
        fake.close()
        energy_settings.cache_clear()
