"""The live sources that need no credentials are `serve`'s default: Azure's
Retail Prices, AWS's Spot Instance Advisor feed (risk for the snapshot's
AWS offers) and AWS's public price-list files (tests/broker/
test_pricing_aws_public.py). Offline, each says so once and the snapshot
stays."""
import logging
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from spotbroker.broker.pricing import risk, store
from spotbroker.broker.pricing.catalog import OfferRow
from spotbroker.broker.pricing.fakes import clouds as fakes
from spotbroker.broker.pricing.fakes import data as fake_data
from spotbroker.broker.pricing.offers import seed_from_catalog
from spotbroker.broker.pricing.settings import DEFAULT_SOURCES, PricingSettings
from spotbroker.broker.pricing.sources import build_sources
from spotbroker.broker.pricing.tracker import PriceTracker
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import PriceOffer


class Clock:
    at = datetime(2026, 11, 1, tzinfo=UTC)

    def now(self):
        return self.at


@pytest.fixture
def clouds():
    fake = fakes.FakeClouds(aws_advisor=fake_data.aws_advisor()).start()
    yield fake
    fake.stop()


def aws_offers(factory, **where):
    with factory() as s:
        return list(s.scalars(select(PriceOffer).filter_by(cloud="aws", **where)))


def test_serve_reads_the_public_live_sources_unless_told_otherwise(monkeypatch):
    monkeypatch.delenv("SPOTBROKER_PRICES_SOURCES", raising=False)  # the suite names "catalog"
    assert PricingSettings(_env_file=None).sources == list(DEFAULT_SOURCES) == ["catalog", "azure", "aws-advisor",
                                                                              "aws-public"]
    named = PricingSettings(_env_file=None, sources="catalog")
    assert named.sources == ["catalog"] and list(build_sources(named)) == ["catalog"]
    assert PricingSettings(_env_file=None).interval("aws-advisor") == 21_600
    assert PricingSettings(_env_file=None).interval("aws-public") == 86_400
    with pytest.raises(ValueError, match="session factory"):  # it remembers file versions in the database
        build_sources(PricingSettings(_env_file=None, sources="aws-public"))


def test_the_advisor_feed_gives_the_snapshots_aws_offers_their_risk(factory, clouds):
    with transaction(factory) as s:
        seed_from_catalog(s)
    settings = PricingSettings(_env_file=None, sources="aws-advisor",
                               aws_advisor_url=f"{clouds.url}/spot-advisor-data.json")
    tracker = PriceTracker(factory, build_sources(settings), settings, clock=Clock())
    result = tracker.refresh("aws-advisor", force=True)
    assert result.risks > 500 and "offers given a published risk" in result.summary()
    band = {(region, itype): risk.from_advisor_band(e["r"]) for region, by_os in
            clouds.aws_advisor["spot_advisor"].items() for itype, e in by_os["Linux"].items()}
    offers = aws_offers(factory)
    assert offers and all((o.risk, o.risk_source) == (band[(o.region, o.instance_type)], "aws-advisor")
                          for o in offers if (o.region, o.instance_type) in band)
    # The snapshot's next read keeps the risk (it has none of its own) ...
    with transaction(factory) as s:
        from spotbroker.broker.pricing.catalog import snapshot_rows
        store.apply_refresh(s, "catalog", [r for r in snapshot_rows() if r.cloud == "aws"],
                            Clock.at + timedelta(days=1), {"aws": None})
    assert {o.risk_source for o in aws_offers(factory)} == {"aws-advisor"}


def test_the_advisor_never_overrides_what_the_live_aws_source_set(factory, clouds):
    row = OfferRow(cloud="aws", region="us-east-1", zone="us-east-1a", zone_id="use1-az1",
                   instance_type="p4d.24xlarge", accelerator="A100", accelerator_count=8, vcpus=96, memory_gib=1152,
                   spot_price=9.0, ondemand_price=21.96, risk=0.01, risk_source="aws-advisor+score")
    with transaction(factory) as s:
        store.apply_refresh(s, "aws", [row], Clock.at, {"aws": None})
        assert store.apply_risks(s, {("aws", "us-east-1", "p4d.24xlarge"): (0.25, "aws-advisor")}) == 0
    (offer,) = aws_offers(factory)
    assert (offer.risk, offer.risk_source) == (0.01, "aws-advisor+score")


def test_offline_each_public_source_says_so_once_and_the_snapshot_stays(factory, caplog, monkeypatch):
    with transaction(factory) as s:
        seed_from_catalog(s)
    monkeypatch.delenv("SPOTBROKER_PRICES_SOURCES", raising=False)
    settings = PricingSettings(_env_file=None, timeout=2, azure_prices_url="http://127.0.0.1:9/api/retail/prices",
                               aws_advisor_url="http://127.0.0.1:9/spot-advisor-data.json",
                               aws_public_url="http://127.0.0.1:9/region_index.json")
    clock = Clock()
    tracker = PriceTracker(factory, build_sources(settings, factory=factory), settings, clock=clock)
    with factory() as s:
        before = {(o.cloud, o.region, o.place, o.instance_type, o.spot_price, o.listed, o.source)
                  for o in s.scalars(select(PriceOffer))}
    with caplog.at_level(logging.WARNING, "spotbroker.pricing"):
        for _ in range(3):
            assert tracker.refresh("azure", force=True) is None
            assert tracker.refresh("aws-advisor", force=True) is None
            assert tracker.refresh("aws-public", force=True) is None
            clock.at += timedelta(hours=7)
    assert caplog.text.count("azure skipped") == 1 and caplog.text.count("aws-advisor skipped") == 1
    assert caplog.text.count("aws-public skipped") == 1
    with factory() as s:
        after = {(o.cloud, o.region, o.place, o.instance_type, o.spot_price, o.listed, o.source)
                 for o in s.scalars(select(PriceOffer))}
    assert after == before
