"""The list-price ranking (`rank_offers`): on-demand-only jobs, and the feasible offers the policy weighs."""
import pytest

from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.pricing.catalog import snapshot_rows
from spotbroker.broker.pricing.offers import rank_offers, seed_from_catalog
from spotbroker.broker.store.db import transaction


@pytest.fixture
def session(factory):
    with transaction(factory) as s:
        assert seed_from_catalog(s) > 2000
        assert seed_from_catalog(s) == 0  # once only
    with factory() as s:
        yield s


def spec(**resources) -> JobSpec:
    return JobSpec.model_validate({"run": "x", "resources": resources})


def cheapest(rows, pred, spot=True):
    prices = [r.spot_price if spot else r.ondemand_price for r in rows if pred(r)]
    return min(p for p in prices if p is not None)


def test_cheapest_spot_offer_wins(session):
    rows = snapshot_rows()
    best = rank_offers(session, spec(accelerators="A100:8"))[0]
    assert best.use_spot and best.accelerator == "A100"
    assert best.price_per_hour == cheapest(rows, lambda r: r.accelerator == "A100" and r.accelerator_count == 8)


def test_on_demand_when_spot_is_off(session):
    best = rank_offers(session, spec(accelerators="H100:8", use_spot=False))[0]
    assert not best.use_spot
    assert best.price_per_hour == cheapest(snapshot_rows(), lambda r: r.accelerator == "H100"
                                           and r.accelerator_count == 8, spot=False)


def test_infra_cpus_and_price_cap_filter(session):
    ranked = rank_offers(session, spec(accelerators="L4:1", infra="gcp/us-central1", cpus="16+"), limit=100)
    assert ranked and all(p.cloud == "gcp" and p.region == "us-central1" for p in ranked)
    assert rank_offers(session, spec(accelerators="A100:8", max_price_per_hour=0.01)) == []
    zone = rank_offers(session, spec(accelerators="T4:1", infra="aws/us-east-1/use1-az2"), limit=100)
    assert zone and {p.zone_id for p in zone} == {"use1-az2"}


def test_any_of_competes_and_ordered_prefers_the_first(session):
    anyof = rank_offers(session, spec(any_of=[{"accelerators": "H100:8"}, {"accelerators": "T4:1"}]))
    assert anyof[0].accelerator == "T4"
    ordered = rank_offers(session, spec(ordered=[{"accelerators": "H100:8"}, {"accelerators": "T4:1"}]))
    assert ordered[0].accelerator == "H100"
    fallback = rank_offers(session, spec(ordered=[{"accelerators": "NOPE:1"}, {"accelerators": "T4:1"}]))
    assert fallback[0].accelerator == "T4"


def test_excluded_places_are_skipped(session):
    first = rank_offers(session, spec(accelerators="A10G:1"))[0]
    second = rank_offers(session, spec(accelerators="A10G:1"), exclude_places=frozenset({first.place}))[0]
    assert second.place != first.place and second.price_per_hour >= first.price_per_hour
