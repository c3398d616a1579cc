"""Current offers and their history: a sample only when a price changes,
unlisting, the catalog never overriding a live source, retention, stale
ranking and paging, and the data-quality rules."""
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.pricing import store
from spotbroker.broker.pricing.catalog import OfferRow
from spotbroker.broker.pricing.normalise import QualityReport, accelerator_name, clean
from spotbroker.broker.pricing.offers import current_offers, rank_offers, seed_from_catalog
from spotbroker.broker.pricing.query import PriceQuery, ranked_prices
from spotbroker.broker.pricing.settings import PricingSettings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Offer, PriceOffer

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def row(zone="us-east-1a", spot=10.0, ondemand=32.0, itype="p4d.24xlarge", region="us-east-1", cloud="aws",
        gpu="A100", count=8.0) -> OfferRow:
    return OfferRow(cloud=cloud, region=region, zone=zone, zone_id=None, instance_type=itype, accelerator=gpu,
                    accelerator_count=count, vcpus=96, memory_gib=1152, spot_price=spot, ondemand_price=ondemand)


def apply(factory, source, rows, at, scope=None):
    with transaction(factory) as s:
        return store.apply_refresh(s, source, rows, at, scope or {"aws": None})


def samples(factory) -> int:
    with factory() as s:
        return s.scalar(select(func.count()).select_from(Offer))


def test_a_sample_is_written_only_when_a_price_changes(factory):
    first = apply(factory, "aws", [row(), row("us-east-1b", spot=11.0)], T0)
    assert (first.new, first.samples) == (2, 2)
    again = apply(factory, "aws", [row(), row("us-east-1b", spot=11.0)], T0 + timedelta(minutes=5))
    assert (again.unchanged, again.samples) == (2, 0) and samples(factory) == 2
    moved = apply(factory, "aws", [row(spot=9.5), row("us-east-1b", spot=11.0)], T0 + timedelta(minutes=10))
    assert (moved.changed, moved.samples) == (1, 1) and "10.0 -> 9.5" in moved.changes[0]
    with factory() as s:
        series = store.history(s, "aws", "us-east-1a", "p4d.24xlarge")
        assert [(x.observed_at, x.spot_price) for x in series] == [(T0, 10.0), (T0 + timedelta(minutes=10), 9.5)]
        offer = s.scalar(select(PriceOffer).where(PriceOffer.place == "us-east-1a"))
        assert offer.observed_at == T0 + timedelta(minutes=10) and offer.spot_price == 9.5


def test_an_offer_no_longer_listed_is_not_placed_on(factory):
    apply(factory, "aws", [row(), row("us-east-1b", spot=5.0)], T0)
    spec = JobSpec.model_validate({"run": "x", "resources": {"accelerators": "A100:8"}})
    with factory() as s:
        assert rank_offers(s, spec)[0].zone == "us-east-1b"
    gone = apply(factory, "aws", [row()], T0 + timedelta(minutes=5))
    assert gone.unlisted == 1
    with factory() as s:
        assert [o.zone for o in current_offers(s, "A100", 8)] == ["us-east-1a"]
        assert [p.zone for p in rank_offers(s, spec)] == ["us-east-1a"]
    back = apply(factory, "aws", [row(), row("us-east-1b", spot=5.0)], T0 + timedelta(minutes=10))
    assert back.changed == 1  # listed again: a new sample marks the gap's end


def test_the_catalog_never_overrides_a_live_source_and_a_live_source_retires_catalog_regions(factory):
    apply(factory, "catalog", [row(spot=20.0), row(region="af-south-1", zone="af-south-1a")], T0,
          {"aws": None})
    # The live API serves us-east-1 only (af-south-1 is listed by the catalog
    # but no longer by the API): the live source is the authority for AWS.
    live = apply(factory, "aws", [row(spot=9.0)], T0 + timedelta(minutes=1))
    assert (live.changed, live.unlisted) == (1, 1)
    cat = apply(factory, "catalog", [row(spot=20.0), row(region="af-south-1", zone="af-south-1a")],
                T0 + timedelta(days=1), {"aws": None})
    assert cat.kept_live == 2 and cat.changed == 0
    with factory() as s:
        (offer,) = current_offers(s, "A100", 8)
        assert (offer.source, offer.spot_price, offer.region) == ("aws", 9.0, "us-east-1")


def test_a_refresh_only_unlists_within_the_regions_it_covered(factory):
    apply(factory, "aws", [row(), row(region="eu-west-1", zone="eu-west-1a")], T0)
    partial = apply(factory, "aws", [row()], T0 + timedelta(minutes=1), {"aws": frozenset({"us-east-1"})})
    assert partial.unlisted == 0


def test_retention_keeps_each_offers_newest_sample(factory):
    apply(factory, "aws", [row(spot=1.0), row("us-east-1b", spot=2.0)], T0)
    apply(factory, "aws", [row(spot=1.5), row("us-east-1b", spot=2.0)], T0 + timedelta(days=50))
    apply(factory, "aws", [row(spot=1.7), row("us-east-1b", spot=2.0)], T0 + timedelta(days=100))
    with transaction(factory) as s:
        assert store.prune_history(s, T0 + timedelta(days=120), retention_days=90) == 1
    with factory() as s:
        left = sorted((o.zone, o.spot_price) for o in s.scalars(select(Offer)))
    # us-east-1b's only sample is 120 days old, and still the price in force.
    assert left == [("us-east-1a", 1.5), ("us-east-1a", 1.7), ("us-east-1b", 2.0)]


def page_all(s, q, now, settings):
    seen, cursor = [], None
    while True:
        page, cursor = ranked_prices(s, replace(q, cursor=cursor), settings, now)
        seen.extend(page)
        if cursor is None:
            return seen


def test_stale_offers_rank_after_fresh_ones_and_pages_cover_everything_once(factory):
    settings = PricingSettings(_env_file=None, aws_interval=300, stale_after_intervals=3)
    spot = {z: float(i + 1) for i, z in enumerate("abcdefg")}
    apply(factory, "aws", [row(z, spot=spot[z]) for z in "abcdefg"], T0)
    apply(factory, "aws", [row(z, spot=spot[z]) for z in "defg"], T0 + timedelta(minutes=20),
          {"aws": frozenset()})  # confirms d..g only; an empty scope unlists nothing
    now = T0 + timedelta(minutes=20)
    with factory() as s:
        ranked = page_all(s, PriceQuery(limit=2), now, settings)
        assert [(p.offer.zone, p.stale) for p in ranked] == [
            ("d", False), ("e", False), ("f", False), ("g", False), ("a", True), ("b", True), ("c", True)]
        cheap = page_all(s, PriceQuery(max_price=5.0, accelerator="a100", count=8, limit=1000), now, settings)
        assert [p.offer.zone for p in cheap] == ["d", "e", "a", "b", "c"]


def test_gcp_machine_price_is_host_plus_gpus(factory):
    """a2-highgpu-8g in asia-northeast1-a, from the bundled snapshot."""
    with transaction(factory) as s:
        seed_from_catalog(s)
    with factory() as s:
        offer = s.scalar(select(PriceOffer).where(PriceOffer.instance_type == "a2-highgpu-8g",
                                                  PriceOffer.zone == "asia-northeast1-a"))
    assert offer.spot_price == pytest.approx(3.34264 + 9.8456) == 13.18824
    assert offer.ondemand_price == pytest.approx(7.58425 + 13.64686) == 21.23111
    assert (offer.accelerator, offer.accelerator_count, offer.source) == ("A100", 8, "catalog")


def test_no_seeded_offer_is_priced_at_zero(factory):
    with transaction(factory) as s:
        seed_from_catalog(s)
    with factory() as s:
        assert not s.scalar(select(func.count()).select_from(PriceOffer).where(
            (PriceOffer.spot_price <= 0) | (PriceOffer.ondemand_price <= 0)))
        # a4-highgpu-8g carries placeholder zeros in the snapshot: no offer.
        assert not s.scalar(select(func.count()).select_from(PriceOffer).where(
            PriceOffer.instance_type == "a4-highgpu-8g"))
        # Standard_ND96isr_H100_v5 says 12 GPUs in the snapshot; it has 8.
        assert {o.accelerator_count for o in s.scalars(select(PriceOffer).where(
            PriceOffer.instance_type == "Standard_ND96isr_H100_v5"))} == {8}


@pytest.mark.parametrize("raw, currency, expect", [
    (row(spot=None), "USD", (None, 32.0)),                 # blank spot: on-demand only
    (row(spot=40.0), "USD", (32.0, 32.0)),                 # spot above on-demand: capped
    (row(spot=32.0), "USD", (32.0, 32.0)),                 # equal: kept, never above
    (row(spot=0.0), "USD", (None, 32.0)),                  # placeholder zero
    (row(spot=0.0, ondemand=0.0), "USD", None),            # nothing left: no offer at $0
    (row(), "EUR", None),                                  # not USD
    (row(count=0), "USD", None),                           # no GPU count
])
def test_data_quality_rules(raw, currency, expect):
    report = QualityReport()
    cleaned = clean(raw, report, currency)
    assert (None if cleaned is None else (cleaned.spot_price, cleaned.ondemand_price)) == expect
    if expect != (10.0, 32.0):
        assert report.counts


@pytest.mark.parametrize("raw, name", [
    ("nvidia-tesla-a100", "A100"), ("nvidia-a100-80gb", "A100-80GB"), ("NVIDIA A100 80GB", "A100-80GB"),
    ("nvidia-h100-80gb", "H100"), ("nvidia-h100-mega-80gb", "H100-MEGA"), ("nvidia-l4", "L4"),
    ("A10G", "A10G"), ("L40S", "L40S"), ("nvidia-tesla-t4", "T4"), ("V100-32GB", "V100-32GB"),
    ("H200", "H200"), ("Radeon MI25", "Radeon MI25"), ("", None),
])
def test_accelerator_names_are_one_across_clouds(raw, name):
    assert accelerator_name(raw) == name
