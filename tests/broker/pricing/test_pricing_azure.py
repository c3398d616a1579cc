"""Azure through its real clients over real HTTP: Retail Prices via httpx
(paged by NextPageLink) and resource SKUs via azure-mgmt-compute, both
answered by the local fake."""
import time
from datetime import UTC, datetime, timedelta

import pytest
from azure.core.credentials import AccessToken
from sqlalchemy import select

from spotbroker.broker.pricing.azure import AzureSource, ResourceSkus
from spotbroker.broker.pricing.base import SourceUnavailable
from spotbroker.broker.pricing.fakes import clouds as fakes
from spotbroker.broker.pricing.fakes import data as fake_data
from spotbroker.broker.pricing.offers import seed_from_catalog
from spotbroker.broker.pricing.settings import PricingSettings
from spotbroker.broker.pricing.tracker import PriceTracker
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import PriceOffer


class Token:
    """A credential as azure-identity gives one (the fake does not check it)."""

    def get_token(self, *scopes, **kwargs):
        return AccessToken("test-token", int(time.time()) + 3600)


@pytest.fixture
def clouds():
    fake = fakes.FakeClouds(azure_items=fake_data.azure_items(), azure_skus=fake_data.azure_skus()).start()
    yield fake
    fake.stop()


def source(fake, skus=True, regions=()):
    # enforce_https=False: the fake speaks plain HTTP (tests only).
    sku_client = ResourceSkus(Token(), "sub-1", fake.url, 5, enforce_https=False) if skus else None
    return AzureSource(f"{fake.url}/api/retail/prices", regions=list(regions), timeout=5, skus=sku_client)


class Clock:
    at = datetime(2026, 11, 1, tzinfo=UTC)

    def now(self):
        return self.at


def refresh(factory, src, clock=None):
    t = PriceTracker(factory, {"azure": src}, PricingSettings(_env_file=None), clock=clock or Clock())
    return t.refresh("azure", force=True)


def offers(factory, **where):
    with factory() as s:
        return list(s.scalars(select(PriceOffer).filter_by(cloud="azure", **where)))


def test_a_full_refresh_pages_through_every_meter(factory, clouds):
    result = refresh(factory, source(clouds))
    assert clouds.requests.count("GET /api/retail/prices") > 5  # followed NextPageLink to the end
    assert "GET /subscriptions/sub-1/providers/Microsoft.Compute/skus" in clouds.requests
    assert result.new > 150
    (nc,) = offers(factory, instance_type="Standard_NC12s_v3", region="eastus")
    # Linux pay-as-you-go and Spot meters; Windows and Low Priority ignored.
    assert (nc.ondemand_price, nc.spot_price, nc.accelerator, nc.accelerator_count) == (6.12, 0.7956, "V100", 2)
    assert all(o.source == "azure" and (o.spot_price is None or o.spot_price > 0) for o in offers(factory))
    assert not offers(factory, instance_type="Standard_D2s_v3")  # neither a GPU size nor a CPU family listed


@pytest.mark.parametrize("skus", [True, False], ids=["resource-skus", "names"])
def test_the_cpu_families_are_offers_too(factory, clouds, skus):
    clouds.azure_items.append(fake_data._azure_item("Standard_F16s_v2", "eastus", 0.677, "F16s v2",
                                                    "Virtual Machines FSv2 Series"))
    refresh(factory, source(clouds, skus=skus))
    (d8,) = offers(factory, instance_type="Standard_D8s_v5", region="eastus")
    assert (d8.ondemand_price, d8.spot_price, d8.accelerator, d8.accelerator_count, d8.vcpus, d8.memory_gib) == \
        (0.384, 0.04224, None, 0, 8, 32)
    (d8l,) = offers(factory, instance_type="Standard_D8ls_v5", region="eastus")
    assert (d8l.vcpus, d8l.memory_gib) == (8, 16)
    # a size of the families that no snapshot row names: its shape from the subscription, else its name
    (f16,) = offers(factory, instance_type="Standard_F16s_v2")
    assert (f16.ondemand_price, f16.accelerator, f16.vcpus, f16.memory_gib) == (0.677, None, 16, 32)


def test_the_gpu_count_comes_from_the_subscriptions_skus(factory, clouds):
    """The snapshot says ND96isr_H100_v5 has 12 GPUs; resource SKUs say 8."""
    refresh(factory, source(clouds))
    assert {o.accelerator_count for o in offers(factory, instance_type="Standard_ND96isr_H100_v5")} == {8}


def test_a_region_the_subscription_may_not_use_is_no_offer(factory, clouds):
    for sku in clouds.azure_skus:
        if sku["name"] == "Standard_NC12s_v3":
            sku["restrictions"] = [{"type": "Location", "values": ["westus"],
                                    "reasonCode": "NotAvailableForSubscription",
                                    "restrictionInfo": {"locations": ["westus"]}}]
    result = refresh(factory, source(clouds))
    assert not offers(factory, instance_type="Standard_NC12s_v3", region="westus")
    assert offers(factory, instance_type="Standard_NC12s_v3", region="eastus")
    assert result.quality.counts["restricted in the region"] == 1


def test_a_price_not_in_usd_is_dropped(factory, clouds):
    for item in clouds.azure_items:
        if item["armSkuName"] == "Standard_NC12s_v3" and item["armRegionName"] == "eastus":
            item["currencyCode"] = "EUR"
    result = refresh(factory, source(clouds))
    assert not offers(factory, instance_type="Standard_NC12s_v3", region="eastus")
    assert result.quality.counts["not in USD (EUR)"] >= 2


def test_a_region_the_catalog_lists_but_the_api_no_longer_serves_is_unlisted(factory, clouds):
    with transaction(factory) as s:
        seed_from_catalog(s)
    assert offers(factory, region="westus3", listed=True)
    clouds.azure_items[:] = [i for i in clouds.azure_items if i["armRegionName"] != "westus3"]
    result = refresh(factory, source(clouds, skus=False))
    assert result.unlisted == len(offers(factory, region="westus3")) > 0
    assert not offers(factory, region="westus3", listed=True)
    assert {o.source for o in offers(factory, listed=True)} == {"azure"}


def test_a_page_failing_midway_leaves_the_previous_prices(factory, clouds):
    clock = Clock()
    refresh(factory, source(clouds), clock)
    before = {(o.instance_type, o.region, o.spot_price) for o in offers(factory)}
    for item in clouds.azure_items:
        item["retailPrice"] = round(item["retailPrice"] * 2, 4)
    clouds.fail_page = 3
    clock.at += timedelta(hours=2)
    assert refresh(factory, source(clouds), clock) is None
    assert {(o.instance_type, o.region, o.spot_price) for o in offers(factory)} == before
    assert all(o.checked_at == Clock.at for o in offers(factory))  # not confirmed: it turns stale in time


def test_unreachable_retail_prices_are_unavailable_quickly():
    src = AzureSource("http://127.0.0.1:9/api/retail/prices", regions=[], timeout=2)
    started = time.monotonic()
    with pytest.raises(SourceUnavailable, match="Azure retail prices unreachable"):
        src.fetch()
    assert time.monotonic() - started < 5


def test_one_region_is_asked_for_by_filter(factory, clouds):
    refresh(factory, source(clouds, skus=False, regions=["eastus"]))
    assert {o.region for o in offers(factory)} == {"eastus"}
