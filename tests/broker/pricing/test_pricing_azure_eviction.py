"""Azure eviction-rate bands from Resource Graph's SpotResources (httpx
against the local fake of the REST API, paged by $skipToken) become the
published risk of Azure's offers, and the placement prior."""
import logging
import time
from datetime import UTC, datetime, timedelta

import pytest
from azure.core.credentials import AccessToken
from azure.core.exceptions import ClientAuthenticationError
from sqlalchemy import select

from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.placement.placer import Placer
from spotbroker.broker.placement.policy import Action
from spotbroker.broker.pricing import risk
from spotbroker.broker.pricing.azure import AzureSource
from spotbroker.broker.pricing.azure_eviction import EvictionRates, band_risk
from spotbroker.broker.pricing.fakes import clouds as fakes
from spotbroker.broker.pricing.fakes import data as fake_data
from spotbroker.broker.pricing.settings import PricingSettings
from spotbroker.broker.pricing.tracker import PriceTracker
from spotbroker.broker.settings import Settings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Job, PriceOffer, Team


class Token:
    """A credential as azure-identity gives one."""

    def get_token(self, *scopes, **kwargs):
        assert scopes == ("https://management.azure.com/.default",)
        return AccessToken("test-token", int(time.time()) + 3600)


class NoCredentials:
    def get_token(self, *scopes, **kwargs):
        raise ClientAuthenticationError("DefaultAzureCredential failed to retrieve a token")


@pytest.fixture
def clouds():
    fake = fakes.FakeClouds(azure_items=fake_data.azure_items(), azure_evictions=fake_data.azure_evictions(),
                            page_size=100).start()
    yield fake
    fake.stop()


class Clock:
    at = datetime(2026, 11, 1, tzinfo=UTC)

    def now(self):
        return self.at


def source(fake, credential=None):
    return AzureSource(f"{fake.url}/api/retail/prices", regions=[], timeout=5,
                       evictions=EvictionRates(credential or Token(), fake.url, 5))


def refresh(factory, src, clock=None):
    t = PriceTracker(factory, {"azure": src}, PricingSettings(_env_file=None), clock=clock or Clock())
    return t.refresh("azure", force=True)


def offers(factory, **where):
    with factory() as s:
        return list(s.scalars(select(PriceOffer).filter_by(cloud="azure", **where)))


def test_bands_read_as_the_advisors():
    assert [band_risk(b) for b in ("0-5", "5-10", "10-15", "15-20", "20+")] == list(risk.ADVISOR_BANDS)
    assert band_risk("") is None and band_risk("unknown") is None


def test_every_page_of_bands_reaches_the_offers(factory, clouds):
    result = refresh(factory, source(clouds))
    pages = -(-len(clouds.azure_evictions) // 100)
    assert pages > 1 and clouds.requests.count("POST /providers/Microsoft.ResourceGraph/resources") == pages
    band = {(r["location"], r["skuName"]): band_risk(r["evictionRate"]) for r in clouds.azure_evictions}
    spot = [o for o in offers(factory) if o.spot_price is not None]
    assert result.new > 100 and spot
    for o in spot:
        assert (o.risk, o.risk_source) == (band[(o.region, o.instance_type.lower())], "azure-eviction")


def test_without_credentials_the_offers_carry_no_risk_and_it_is_said_once(factory, clouds, caplog):
    src = source(clouds, NoCredentials())
    with caplog.at_level(logging.WARNING, "spotbroker.pricing"):
        clock = Clock()
        assert refresh(factory, src, clock).new > 100  # the prices still came
        clock.at += timedelta(hours=2)
        refresh(factory, src, clock)
    assert caplog.text.count("azure offers without eviction rates") == 1
    assert {o.risk for o in offers(factory)} == {None}
    assert "POST /providers/Microsoft.ResourceGraph/resources" not in clouds.requests


def test_a_page_of_bands_failing_midway_fails_the_refresh(factory, clouds):
    clock = Clock()
    refresh(factory, source(clouds), clock)
    before = {(o.region, o.instance_type, o.risk) for o in offers(factory)}
    clouds.azure_evictions[:] = [{**r, "evictionRate": "20+"} for r in clouds.azure_evictions]
    clouds.fail_page = 2
    clock.at += timedelta(hours=2)
    assert refresh(factory, source(clouds), clock) is None
    assert {(o.region, o.instance_type, o.risk) for o in offers(factory)} == before


def test_an_equally_priced_region_with_a_higher_eviction_band_is_chosen_later(factory, clouds):
    size = "Standard_NC24ads_A100_v4"
    clouds.azure_items[:] = [i for i in clouds.azure_items if i["armSkuName"] == size]
    regions = sorted({i["armRegionName"] for i in clouds.azure_items})[:2]
    clouds.azure_items[:] = [{**i, "retailPrice": 1.0 if "Spot" in i["meterName"] else 3.0}
                             for i in clouds.azure_items if i["armRegionName"] in regions]
    # the first region (also the first listed) has the worse band
    clouds.azure_evictions[:] = [{"id": f"/x/{r}", "skuName": size.lower(), "location": r, "evictionRate": band}
                                 for r, band in zip(regions, ("20+", "0-5"), strict=True)]
    refresh(factory, source(clouds))
    now = Clock.at
    spec = JobSpec.model_validate({"run": "x", "resources": {"accelerators": "A100-80GB:1", "infra": "azure"}})
    with transaction(factory) as s:
        team = Team(name="ml", created_at=now)
        s.add(team)
        s.flush()
        job = Job(team_id=team.id, name="j", state="PENDING", spec=spec.model_dump(mode="json"), restarts=0,
                  recoveries=0, created_at=now, updated_at=now, version=1)
        s.add(job)
    with factory() as s:
        choice = Placer(Settings(_env_file=None)).choose(s, s.get(Job, job.id), spec, now)
    assert choice.action is Action.LAUNCH
    assert [p.region for p in choice.placements if p.use_spot][:2] == [regions[1], regions[0]]
