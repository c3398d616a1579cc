"""GCP zones through google-cloud-compute's MachineTypesClient and
AcceleratorTypesClient (REST transport, anonymous credentials) against the
local fake of the Compute API's aggregated lists, paged."""
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from spotbroker.broker.pricing.fakes import clouds as fakes
from spotbroker.broker.pricing.fakes import data as fake_data
from spotbroker.broker.pricing.gcp import GcpSource, snapshot_machines
from spotbroker.broker.pricing.gcp_zones import NAME_FILTER
from spotbroker.broker.pricing.normalise import QualityReport
from spotbroker.broker.pricing.settings import PricingSettings
from spotbroker.broker.pricing.tracker import PriceTracker
from spotbroker.broker.store.models import PriceOffer


@pytest.fixture
def clouds():
    fake = fakes.FakeClouds(gcp_skus=fake_data.gcp_skus(), gcp_machine_types=fake_data.gcp_machine_types(),
                            gcp_accelerator_types=fake_data.gcp_accelerator_types(), page_size=1000).start()
    yield fake
    fake.stop()


class Clock:
    def now(self):
        return datetime(2026, 11, 1, tzinfo=UTC)


def source(fake, project="my-project"):
    return GcpSource.from_settings(PricingSettings(_env_file=None, gcp_endpoint=fake.url, gcp_project=project,
                                                   timeout=5))


def refresh(factory, src):
    return PriceTracker(factory, {"gcp": src}, PricingSettings(_env_file=None), clock=Clock()).refresh(
        "gcp", force=True)


def places(factory, **where):
    with factory() as s:
        return {(o.instance_type, o.zone) for o in s.scalars(select(PriceOffer).filter_by(cloud="gcp", listed=True,
                                                                                          **where))}


def test_zones_come_from_the_compute_api_every_page(factory, clouds):
    # GPU machines and the CPU families' types; the name filter leaves the other CPU types (e2) out
    listed = sum(1 for _, m in clouds.gcp_machine_types if not m["name"].startswith("e2-"))
    src = source(clouds)
    result = refresh(factory, src)
    assert result is not None and result.new > 600
    # every page of 500 (the API's largest), by nextPageToken
    assert listed > 500 and clouds.requests.count(
        "GET /compute/v1/projects/my-project/aggregated/machineTypes") == -(-listed // 500)
    assert clouds.requests.count("GET /compute/v1/projects/my-project/aggregated/acceleratorTypes") == 1
    machines = src.zones.machines(QualityReport())
    # an N1 type is a machine per GPU of its zone it may carry (gcp_n1), the others one each
    n1_types = sum(1 for _, m in clouds.gcp_machine_types if m["name"].startswith("n1-"))
    assert n1_types and len([m for m in machines if "+" not in m.instance_type]) == listed - n1_types
    t4 = next(m for m in machines if m.instance_type == "n1-highmem-4+T4:1" and m.zone == "us-central1-a")
    assert (t4.vcpus, t4.memory_gib, t4.accelerator, t4.count, t4.series) == (4.0, 26.0, "T4", 1, "n1")
    a2 = next(m for m in machines if m.instance_type == "a2-highgpu-8g" and m.zone == "asia-northeast1-a")
    assert (a2.region, a2.vcpus, a2.memory_gib, a2.accelerator, a2.count, a2.series) == \
        ("asia-northeast1", 96.0, 680.0, "A100", 8, "a2-highgpu")
    assert {(m.instance_type, m.zone) for m in machines} == {(m.instance_type, m.zone) for m in snapshot_machines()}
    assert NAME_FILTER.startswith("name eq '(") and "|a2-megagpu|" in NAME_FILTER


def test_the_cpu_families_are_priced_from_their_core_and_ram_skus(factory, clouds):
    refresh(factory, source(clouds))
    with factory() as s:
        n2 = s.scalars(select(PriceOffer).filter_by(cloud="gcp", instance_type="n2-standard-8",
                                                   zone="us-central1-a")).one()
        kinds = {o.instance_type.split("-")[0] for o in s.scalars(select(PriceOffer).filter_by(
            cloud="gcp", accelerator=None))}
    assert (n2.accelerator, n2.accelerator_count, n2.vcpus, n2.memory_gib) == (None, 0, 8, 32)
    # 8 cores and 32 GiB at the N2 SKUs: the snapshot's n2-standard-8 prices (0.38847, 0.12701)
    assert n2.ondemand_price == pytest.approx(0.38847, abs=1e-4) and n2.spot_price == pytest.approx(0.12701, abs=1e-4)
    assert kinds == {"n2"}


def test_a_zone_that_stops_offering_a_machine_type_unlists_it(factory, clouds):
    src = source(clouds)
    refresh(factory, src)
    assert ("a2-highgpu-8g", "asia-northeast1-a") in places(factory)
    clouds.gcp_machine_types[:] = [(z, m) for z, m in clouds.gcp_machine_types
                                   if not (z == "asia-northeast1-a" and m["name"] == "a2-highgpu-8g")]
    result = refresh(factory, src)
    assert result.unlisted == 1 and ("a2-highgpu-8g", "asia-northeast1-a") not in places(factory)


def test_a_machine_type_whose_gpu_the_zone_does_not_list_is_no_offer(factory, clouds):
    clouds.gcp_accelerator_types[:] = [(z, a) for z, a in clouds.gcp_accelerator_types
                                       if not (z == "us-central1-a" and a["name"] == "nvidia-l4")]
    result = refresh(factory, source(clouds))
    assert result.quality.counts["GPU not offered in the zone"] > 0
    assert not places(factory, zone="us-central1-a", accelerator="L4")
    assert places(factory, zone="us-central1-b", accelerator="L4")


def test_without_the_compute_api_the_snapshot_zones_are_priced(factory, clouds, caplog):
    broken = GcpSource.from_settings(PricingSettings(  # nothing listens on port 9
        _env_file=None, gcp_endpoint=clouds.url, gcp_compute_endpoint="http://127.0.0.1:9", gcp_project="p",
        timeout=5))
    result = refresh(factory, broken)
    assert result is not None and result.new > 600  # billing still answered
    assert "gcp zones from the snapshot" in caplog.text
    assert not source(clouds, project=None).zones  # no project: no Compute API asked at all


def test_a_compute_page_failing_midway_fails_the_refresh(factory, clouds):
    clouds.page_size, clouds.fail_page = 100, 3
    src = source(clouds)
    assert refresh(factory, src) is None
    assert not places(factory)
