"""Energy and grid figures: the bundled snapshot, the power estimate, and
the live Electricity Maps source against a local server answering in its
real shape."""
import csv
import statistics
from importlib import resources

import pytest
from sqlalchemy import select
from support.emapsfake import ElectricityMapsFake
from support.helpers import run_to_end, submit

from spotbroker.broker.energy import electricitymaps, grid, power
from spotbroker.broker.pricing import catalog
from spotbroker.broker.store.models import Attempt


def _catalog_regions() -> set[tuple[str, str]]:
    found = set()
    for name in ("aws_vms_gpu.csv", "aws_vms_cpu.csv", "gcp_vms_gpu.csv", "gcp_vms_cpu.csv", "azure_vms_gpu.csv",
                 "azure_vms_cpu.csv"):
        with resources.files("spotbroker.broker.pricing").joinpath("catalog_data", name).open() as f:
            found |= {(name.split("_")[0], r["Region"]) for r in csv.DictReader(f)}
    return found


def test_every_region_the_catalog_prices_has_a_sourced_figure():
    readme = resources.files("spotbroker.broker.energy").joinpath("data", "README.md").read_text()
    for cloud, region in _catalog_regions():
        figure = grid.intensity(cloud, region)
        assert not figure.estimated, (cloud, region)
        assert 0 < figure.g_per_kwh < 1200
        assert f"`{figure.source}`" in readme, figure.source  # every source key is explained
        assert figure.zone, (cloud, region)


def test_a_region_outside_the_snapshot_says_so():
    figure = grid.intensity("aws", "mars-north-1")
    assert figure.estimated and "median of aws" in figure.source
    assert figure.g_per_kwh == statistics.median(v.g_per_kwh for (c, _), v in grid.snapshot().items() if c == "aws")


def test_cleaner_grids_are_cleaner():
    # A few orderings any source agrees on: hydro and nuclear grids against coal-heavy ones.
    assert grid.intensity("aws", "eu-north-1").g_per_kwh < grid.intensity("aws", "us-east-1").g_per_kwh
    assert grid.intensity("gcp", "europe-west9").g_per_kwh < grid.intensity("gcp", "us-east1").g_per_kwh
    assert grid.intensity("aws", "ca-central-1").g_per_kwh < grid.intensity("aws", "ap-south-1").g_per_kwh


def test_snapshot_date_is_recorded():
    assert grid.snapshot_date().year >= 2026
    assert catalog.snapshot_date() is not None


def test_power_estimate_adds_gpus_cpus_memory_times_pue():
    p3 = power.estimate("aws", "V100", 8, 64, 488)
    watts = 8 * 300 + 64 * (0.74 + 3.5) / 2 + 488 * 0.392
    assert p3.kw == pytest.approx(watts * 1.135 / 1000)
    assert "8 × 300 W GPU" in p3.basis and "PUE 1.135" in p3.basis
    # Case and an unknown name: the catalog spells names its own way.
    assert power.gpu_watts("a100-80gb")[0] == 400
    watts, why = power.gpu_watts("Z9000")
    assert watts == power.UNKNOWN_GPU_WATTS and "not in the table" in why
    cpu_only = power.estimate("gcp", None, 0, 8, 32)
    assert cpu_only.gpu_watts == 0 and cpu_only.kw == pytest.approx((8 * (0.71 + 4.26) / 2 + 32 * 0.392) * 1.1 / 1000)


def test_measured_power_uses_the_gpu_joules():
    # 4 GPUs at 250 W for an hour, measured: 3.6e6 J.
    kw = power.measured_kw(4 * 250 * 3600, 3600, "azure", 24, 220)
    assert kw == pytest.approx((1000 + 24 * (0.78 + 3.76) / 2 + 220 * 0.392) * 1.185 / 1000)
    assert power.measured_kw(100, 0, "aws", 1, 1) == 0


@pytest.fixture
def emaps():
    server = ElectricityMapsFake("operator-key")
    yield server
    server.close()


def test_live_readings_for_the_zones_it_knows(emaps):
    readings = electricitymaps.Client("operator-key", emaps.url).latest(["DE", "FR", "XX", "DE"])
    assert set(readings) == {"DE", "FR"}  # the unknown zone is left out, the duplicate asked once
    assert readings["DE"].g_per_kwh == 302 and not readings["DE"].estimated
    assert readings["FR"].estimated and readings["FR"].factor == "lifecycle"
    assert readings["DE"].at.isoformat() == "2026-11-28T17:00:00+00:00"
    assert all(token == "operator-key" for _, token in emaps.seen)
    assert len(emaps.seen) == 3


def test_a_refused_key_or_no_service_is_unavailable(emaps):
    with pytest.raises(electricitymaps.Unavailable, match="refused the key"):
        electricitymaps.Client("wrong", emaps.url).latest(["DE"])
    emaps.close()
    with pytest.raises(electricitymaps.Unavailable, match="unreachable"):
        electricitymaps.Client("operator-key", emaps.url, timeout=2).latest(["DE"])


def test_a_malformed_answer_is_not_a_reading():
    with pytest.raises(ValueError):
        electricitymaps.parse({"zone": "DE", "carbonIntensity": None, "datetime": "2026-11-28T17:00:00Z"})


def test_the_reconciler_fixes_each_attempts_power_and_grid_at_launch(env):
    factory, settings, team = env
    job = submit(factory, team, name="t", run="true", resources={"accelerators": "V100:1"})
    assert run_to_end(factory, settings, job) == "SUCCEEDED"
    with factory() as s:
        attempt = s.scalars(select(Attempt).where(Attempt.job_id == job)).one()
    assert attempt.accelerator == "V100"
    rated = power.estimate(attempt.cloud, "V100", attempt.accelerator_count, None, None)
    assert attempt.power_kw > rated.kw  # the GPU's rating, and the instance's vCPUs and memory on top
    assert attempt.grid_g_per_kwh == grid.intensity(attempt.cloud, attempt.region).g_per_kwh
    assert attempt.energy_basis == "estimated"
