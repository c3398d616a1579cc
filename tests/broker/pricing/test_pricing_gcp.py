"""GCP through google-cloud-billing's CloudCatalogClient (REST transport,
anonymous credentials) against the local fake of the Billing Catalog API."""
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from spotbroker.broker.pricing.base import SourceUnavailable
from spotbroker.broker.pricing.fakes import clouds as fakes
from spotbroker.broker.pricing.fakes import data as fake_data
from spotbroker.broker.pricing.gcp import GcpSource
from spotbroker.broker.pricing.offers import seed_from_catalog
from spotbroker.broker.pricing.settings import PricingSettings
from spotbroker.broker.pricing.tracker import PriceTracker
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import PriceOffer


@pytest.fixture
def clouds():
    fake = fakes.FakeClouds(gcp_skus=fake_data.gcp_skus()).start()
    yield fake
    fake.stop()


class Clock:
    at = datetime(2026, 11, 1, tzinfo=UTC)

    def now(self):
        return self.at


def source(fake):
    return GcpSource.from_settings(PricingSettings(_env_file=None, gcp_endpoint=fake.url, timeout=5))


def refresh(factory, fake, clock=None):
    t = PriceTracker(factory, {"gcp": source(fake)}, PricingSettings(_env_file=None), clock=clock or Clock())
    return t.refresh("gcp", force=True)


def offers(factory, **where):
    with factory() as s:
        return list(s.scalars(select(PriceOffer).filter_by(cloud="gcp", **where)))


def test_a_machine_is_priced_as_cores_plus_ram_plus_gpus(factory, clouds):
    result = refresh(factory, clouds)
    pages = -(-len(clouds.gcp_skus) // clouds.page_size)
    assert pages > 1 and clouds.requests.count("GET /v1/services/6F81-5844-456A/skus") == pages  # by nextPageToken
    assert result.new > 600
    (a2,) = offers(factory, instance_type="a2-highgpu-8g", zone="asia-northeast1-a")
    assert (a2.spot_price, a2.ondemand_price) == (13.18824, 21.23111)
    assert (a2.accelerator, a2.accelerator_count, a2.source) == ("A100", 8, "gcp")
    (l4,) = offers(factory, instance_type="g2-standard-48", zone="us-central1-a")
    assert (l4.accelerator, l4.accelerator_count) == ("L4", 4)


def test_placeholder_zero_prices_make_no_offer(factory, clouds):
    """The snapshot prices a4-highgpu-8g (B200) at 0.0: no such SKU price is taken."""
    result = refresh(factory, clouds)
    assert not offers(factory, instance_type="a4-highgpu-8g")
    assert result.quality.counts["placeholder zero price"] > 0
    assert all((o.spot_price or 1) > 0 and (o.ondemand_price or 1) > 0 for o in offers(factory))


def test_a_price_not_in_usd_is_not_summed(factory, clouds):
    for sku in clouds.gcp_skus:
        if sku["description"] == "Nvidia L4 GPU running in us-central1":
            sku["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"]["currencyCode"] = "EUR"
    result = refresh(factory, clouds)
    assert result.quality.counts["not in USD (EUR)"] == 1
    assert {o.ondemand_price for o in offers(factory, instance_type="g2-standard-48", region="us-central1")} == {None}
    assert all(o.spot_price for o in offers(factory, instance_type="g2-standard-48", region="us-central1"))


def test_a_region_the_api_no_longer_prices_is_unlisted(factory, clouds):
    with transaction(factory) as s:
        seed_from_catalog(s)
    clouds.gcp_skus[:] = [s for s in clouds.gcp_skus if s["serviceRegions"] != ["asia-northeast1"]]
    result = refresh(factory, clouds)
    assert result.quality.counts["region not served by the API"] == 1
    assert offers(factory, region="asia-northeast1")
    assert not offers(factory, region="asia-northeast1", listed=True)


def test_a_page_failing_midway_leaves_the_previous_prices(factory, clouds):
    clock = Clock()
    refresh(factory, clouds, clock)
    before = {(o.instance_type, o.zone, o.spot_price) for o in offers(factory)}
    for sku in clouds.gcp_skus:
        sku["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"]["units"] = "9"
    clouds.fail_page = 5
    clock.at += timedelta(hours=2)
    assert refresh(factory, clouds, clock) is None
    assert {(o.instance_type, o.zone, o.spot_price) for o in offers(factory)} == before


def test_unreachable_catalog_is_unavailable_quickly():
    src = GcpSource.from_settings(PricingSettings(_env_file=None, gcp_endpoint="http://127.0.0.1:9", timeout=2))
    started = time.monotonic()
    with pytest.raises(SourceUnavailable, match="GCP billing catalog unreachable"):
        src.fetch()
    assert time.monotonic() - started < 10


def test_a_gpu_on_an_n1_machine_is_priced_as_its_cores_ram_and_gpus(factory, clouds):
    refresh(factory, clouds)
    (t4,) = offers(factory, instance_type="n1-highmem-4+T4:1", zone="us-central1-a")
    # the snapshot's n1-highmem-4 (0.23661 / 0.06466) and T4 (0.35 / 0.175) at the N1 and T4 SKUs
    assert (t4.accelerator, t4.accelerator_count, t4.vcpus, t4.memory_gib, t4.source) == ("T4", 1, 4, 26, "gcp")
    assert t4.ondemand_price == pytest.approx(0.58661, abs=1e-4) and t4.spot_price == pytest.approx(0.23966, abs=1e-4)
