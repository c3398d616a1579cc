"""Energy and emissions ride on the ledger's entries: node-hours × the
attempt's power at the wall × its grid's intensity, cut and corrected
exactly as dollars."""
from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select
from support.emapsfake import ElectricityMapsFake
from support.world import T0

from spotbroker.broker.energy import footprint, grid, power, tracker
from spotbroker.broker.energy.settings import EnergySettings
from spotbroker.broker.money.accrual import Accruer
from spotbroker.broker.money.settings import MoneySettings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, GridReading, Offer
from spotbroker.broker.store.moneymodels import LedgerEntry


def accrue(factory, clock) -> None:
    Accruer(factory, MoneySettings(_env_file=None), clock=clock, owner="a").accrue(clock.now())


def totals(factory, attempt_id) -> tuple[float, float, float]:
    with factory() as s:
        return tuple(s.execute(select(func.sum(LedgerEntry.node_hours), func.sum(LedgerEntry.kwh),
                                      func.sum(LedgerEntry.co2e_kg)).where(LedgerEntry.attempt_id == attempt_id)).one())


def set_footprint(factory, attempt_id, kw, g_per_kwh) -> None:
    with transaction(factory) as s:
        a = s.get(Attempt, attempt_id)
        a.power_kw, a.grid_g_per_kwh, a.energy_basis = kw, g_per_kwh, footprint.ESTIMATED


def test_kwh_and_co2e_are_node_hours_times_power_times_intensity(factory, world, clock):
    job = world.job(world.team())
    a = world.attempt(job, price=3.0, nodes=2, spot=False)
    set_footprint(factory, a, 3.0, 400.0)
    for _ in range(90):
        clock.advance(minutes=1)
        accrue(factory, clock)
    node_hours, kwh, co2e = totals(factory, a)
    assert node_hours == pytest.approx(3.0)           # 2 nodes x 1.5 h
    assert kwh == pytest.approx(9.0)                  # x 3 kW
    assert co2e == pytest.approx(3.6)                 # x 400 g/kWh


def test_a_late_end_corrects_energy_as_it_corrects_dollars(factory, world, clock):
    job = world.job(world.team())
    a = world.attempt(job, price=6.0)
    set_footprint(factory, a, 2.0, 100.0)
    clock.advance(hours=1)
    accrue(factory, clock)
    world.end(a, T0 + timedelta(minutes=30))
    clock.advance(minutes=1)
    accrue(factory, clock)
    node_hours, kwh, co2e = totals(factory, a)
    assert node_hours == pytest.approx(0.5) and kwh == pytest.approx(1.0) and co2e == pytest.approx(0.1)
    with factory() as s:
        kinds = {k for (k,) in s.execute(select(LedgerEntry.kind).where(LedgerEntry.kwh < 0))}
    assert kinds == {"correction"}


def test_an_attempt_launched_gets_its_place_power_and_grid(factory, world):
    job = world.job(world.team())
    a = world.attempt(job, cloud="aws", region="eu-north-1", instance_type="p3.16xlarge", accelerator="V100")
    with transaction(factory) as s:
        s.add(Offer(cloud="aws", region="eu-north-1", zone=None, zone_id="eun1-az1", instance_type="p3.16xlarge",
                    accelerator="V100", accelerator_count=8, vcpus=64, memory_gib=488, spot_price=7.0,
                    ondemand_price=24.48, observed_at=T0, source="catalog"))
    with transaction(factory) as s:
        footprint.attach(s, s.get(Attempt, a), T0)
    with factory() as s:
        got = s.get(Attempt, a)
        assert got.power_kw == pytest.approx(power.estimate("aws", "V100", 8, 64, 488).kw)
        assert got.grid_g_per_kwh == grid.intensity("aws", "eu-north-1").g_per_kwh
        assert got.grid_source == "eea" and got.energy_basis == "estimated"


def test_measured_gpu_energy_replaces_the_rating(factory, world):
    job = world.job(world.team())
    a = world.attempt(job, nodes=2, accelerator="A100", instance_type="p4d.24xlarge")
    with transaction(factory) as s:
        attempt = s.get(Attempt, a)
        footprint.attach(s, attempt, T0)
        rated = attempt.power_kw
        # Two nodes of 8 GPUs at 250 W each for an hour: well under the 400 W rating.
        footprint.record_measured(s, attempt, gpu_joules=2 * 8 * 250 * 3600, seconds=3600)
    with factory() as s:
        got = s.get(Attempt, a)
        assert got.energy_basis == "measured" and got.gpu_joules == 2 * 8 * 250 * 3600
        assert got.power_kw == pytest.approx(power.measured_kw(8 * 250 * 3600, 3600, "aws", None, None))
        assert got.power_kw < rated


@pytest.fixture
def emaps():
    server = ElectricityMapsFake("operator-key", at="2026-03-02T11:00:00.000Z")  # an hour before T0
    yield server
    server.close()


def energy(emaps, **kw) -> EnergySettings:
    return EnergySettings(_env_file=None, electricitymaps_url=emaps.url, **kw)


def test_live_readings_are_kept_once_and_charged_while_fresh(factory, world, emaps):
    assert tracker.refresh(factory, energy(emaps), T0) == 0 and emaps.seen == []  # no key: nothing asked
    keyed = energy(emaps, electricitymaps_token="operator-key", zones="DE,FR,XX")
    assert tracker.refresh(factory, keyed, T0) == 2
    assert tracker.refresh(factory, keyed, T0 + timedelta(minutes=5)) == 0  # the same hours: kept once
    with factory() as s:
        assert s.scalar(select(func.count()).select_from(GridReading)) == 2
    # eu-central-1 draws from DE's grid: an attempt launched now is charged at the live 302 g.
    job = world.job(world.team())
    a = world.attempt(job, cloud="aws", region="eu-central-1")
    with transaction(factory) as s:
        footprint.attach(s, s.get(Attempt, a), T0)
    with factory() as s:
        got = s.get(Attempt, a)
        assert got.grid_g_per_kwh == 302 and got.grid_source.startswith("electricitymaps DE")
    # Four hours on, the reading is stale: the snapshot's yearly figure again.
    with transaction(factory) as s:
        footprint.attach(s, s.get(Attempt, a), T0 + timedelta(hours=4))
    with factory() as s:
        got = s.get(Attempt, a)
        assert got.grid_g_per_kwh == grid.intensity("aws", "eu-central-1").g_per_kwh and got.grid_source == "eea"


def test_a_refused_key_keeps_nothing_and_says_so(factory, emaps, caplog):
    wrong = energy(emaps, electricitymaps_token="stolen", zones="DE")
    assert tracker.refresh(factory, wrong, T0) == 0
    assert "refused the key" in caplog.text and "stolen" not in caplog.text
