"""The list-price ranking (`rank_offers`): on-demand-only jobs, and the feasible offers the policy weighs."""
import pytest

from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.pricing.catalog import snapshot_rows
from spotbroker.broker.pricing.offers import rank_offers, seed_from_catalog, why_none_fits
from spotbroker.broker.store.db import transaction


def test_the_snapshot_loads_once(factory):
    with transaction(factory) as s:
        assert seed_from_catalog(s) > 2000
        assert seed_from_catalog(s) == 0  # once only


@pytest.fixture
def session(factory, catalog_offers):
    with transaction(factory) as s:
        assert seed_from_catalog(s) == 0  # (loaded already, as a broker's first start loads it)
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


def test_a_t4_on_gcp_is_an_n1_machine_with_one(session):
    """`infra: gcp` with a T4 ended `no_feasible_offer`: GCP attaches T4s to N1
    machines, and the snapshot had no N1 host to price one with. A SkyPilot
    task naming the N1 type (`instance_type: n1-highmem-8`) gets that size."""
    best = rank_offers(session, spec(accelerators="T4:1", infra="gcp"))[0]
    assert (best.cloud, best.accelerator, best.accelerator_count) == ("gcp", "T4", 1)
    assert best.instance_type == "n1-highmem-4+T4:1"  # the size SkyPilot gives a task naming no cpus
    named = rank_offers(session, spec(accelerators="T4:1", infra="gcp", instance_type="n1-highmem-8"), limit=100)
    assert named and {p.instance_type for p in named} == {"n1-highmem-8+T4:1"}
    assert why_none_fits(session, spec(accelerators="V100:8", infra="gcp/us-central1")) is None


def test_an_aws_zone_by_name_is_the_zone_the_live_prices_name_so(factory, session):
    """`infra: aws/us-east-1/us-east-1b` (SkyPilot's form) fitted no offer: the
    catalog names AWS zones by ID. The live AWS prices name this account's
    zones beside their IDs; every offer in that zone fits, the catalog's too."""
    from sqlalchemy import update

    from spotbroker.broker.store.models import PriceOffer

    told = why_none_fits(session, spec(accelerators="T4:1", infra="aws/us-east-1/us-east-1b"))
    assert "AWS zone names are known from this account's live AWS prices" in told and "use1-az1" in told, told
    with transaction(factory) as s:  # as the live source writes a row: its zone's name and ID
        s.execute(update(PriceOffer).where(PriceOffer.zone_id == "use1-az2", PriceOffer.instance_type == "g4dn.xlarge")
                  .values(zone="us-east-1b"))
    session.rollback()  # a new snapshot: the update above is seen
    named = rank_offers(session, spec(accelerators="T4:1", infra="aws/us-east-1/us-east-1b"), limit=100)
    assert {p.zone_id for p in named} == {"use1-az2"} and {p.instance_type for p in named} > {"g4dn.xlarge"}
    assert rank_offers(session, spec(accelerators="T4:1", infra="aws/*/us-east-1b"), limit=100)


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


def everything_the_policy_could_weigh(session, accelerator, count):
    """The zones as the exhaustive path built them: every listed offer of the
    shape with both prices, one per policy zone (the first listed wins)."""
    from spotbroker.broker.placement.placer import offer_key
    from spotbroker.broker.pricing.offers import current_offers

    zones = {}
    for o in current_offers(session, accelerator, count):
        if o.spot_price is not None and o.ondemand_price is not None:
            zones.setdefault(offer_key(o), (o.spot_price, o.ondemand_price))
    return zones


@pytest.mark.parametrize("shape", ["T4:1", "A100:8", "L4:1", "H100:8"])
def test_the_placement_path_loads_only_what_a_decision_uses_and_misses_none_of_it(session, settings, shape):
    from spotbroker.broker.placement.placer import MAX_ZONES, Placer

    name, count = shape.split(":")
    all_zones = everything_the_policy_could_weigh(session, name, float(count))
    assert len(all_zones) > MAX_ZONES or shape == "H100:8"
    placer = Placer(settings)
    s = spec(accelerators=shape)
    listed, zones = placer._candidates(session, s, "shape")
    assert not listed and len(zones) <= max(2 * MAX_ZONES + 1, len(all_zones))

    def top(z, prices):
        return sorted((prices(v)[0], k) for k, v in z.items())[:MAX_ZONES]

    # The cheapest MAX_ZONES by spot price (the policy's zones) and the cheapest on-demand are the same.
    assert top(zones, lambda v: (v[1].price_per_hour,)) == top(all_zones, lambda v: v)
    assert min(v[2].price_per_hour for v in zones.values()) == min(od for _, od in all_zones.values())


def test_a_running_attempt_is_weighed_in_its_zone_however_dear(session, settings):
    from spotbroker.broker.placement.placer import Placer, attempt_key
    from spotbroker.broker.store.models import Attempt

    dearest = max(rank_offers(session, spec(accelerators="T4:1"), limit=1000), key=lambda p: p.price_per_hour)
    running = Attempt(cloud=dearest.cloud, region=dearest.region, zone=dearest.zone, zone_id=dearest.zone_id,
                      instance_type=dearest.instance_type, use_spot=True)
    placer = Placer(settings)
    _, zones = placer._candidates(session, spec(accelerators="T4:1"), "shape")
    assert attempt_key(running) not in zones  # beyond the cheapest: not loaded for a new job
    _, zones = placer._candidates(session, spec(accelerators="T4:1"), "shape", running)
    assert zones[attempt_key(running)][1].price_per_hour == dearest.price_per_hour


@pytest.mark.parametrize("resources, why", [
    ({"accelerators": "A100:0.5"}, "no offer has 0.5 A100 per node"),
    ({"instance_type": "p9.bogus"}, "no offer is instance type p9.bogus"),
    ({"accelerators": "T4:1", "instance_type": "p4d.24xlarge"},
     "no offer of 1 T4 per node is instance type p4d.24xlarge"),
    ({"accelerators": "T4:1", "infra": "aws/mars-east-1"}, "no offer of 1 T4 per node is in aws/mars-east-1"),
    ({"cpus": "100000"}, "no CPU machine has cpus 100000"),
    ({"any_of": [{"accelerators": "A100:3"}, {"accelerators": "T4:3"}]},
     "no offer has 3 A100 per node; no offer has 3 T4 per node"),
    ({"accelerators": "A100:8", "max_price_per_hour": 1}, "no offer of 8 A100 per node costs at most $1/h (the "
     "cheapest: $"),  # (was None: a bare no_feasible_offer)
    ({"cpus": "4", "max_price_per_hour": 0.001}, "no CPU machine costs at most $0.001/h (the cheapest: $"),
    ({"accelerators": "T4:1"}, None),  # it fits
    ({"accelerators": "H100:16", "infra": "k8s"}, None),  # an operator's clusters are not offers
])
def test_what_no_offer_has_is_named(session, resources, why):
    told = why_none_fits(session, spec(**resources))
    assert told == why or (why is not None and why.endswith("$") and told.startswith(why)), told
