"""`GET /v1/prices` and `/v1/prices/history` over HTTP, from the bundled snapshot."""
import base64
import json
from datetime import timedelta

from conftest import ADMIN_TOKEN

from spotbroker.broker.clock import SYSTEM_CLOCK
from spotbroker.broker.pricing import store
from spotbroker.broker.pricing.catalog import OfferRow
from spotbroker.broker.store.db import make_engine, make_session_factory, transaction

FIELDS = {"cloud", "region", "zone", "zone_id", "instance_type", "accelerator", "accelerator_count", "vcpus",
          "memory_gib", "spot_price", "on_demand_price", "observed_at", "source", "stale", "risk"}


def test_prices_need_a_token(api):
    assert api.get("/v1/prices").status_code == 401
    assert api.get("/v1/prices/history", params={"cloud": "aws", "zone": "x", "instance_type": "y"}
                   ).status_code == 401


def test_cheapest_first_across_the_three_clouds(api, team_headers):
    h = team_headers()
    r = api.get("/v1/prices", params={"accelerator": "A100", "count": 8, "spot": "true"}, headers=h)
    assert r.status_code == 200, r.text
    offers = r.json()["offers"]
    assert set(r.json()) == {"offers", "next_cursor"}
    assert offers and all(FIELDS <= set(o) for o in offers)
    assert {o["cloud"] for o in offers} == {"aws", "gcp", "azure"}
    prices = [o["spot_price"] for o in offers]
    assert prices == sorted(prices) and all(p > 0 for p in prices)
    assert all(o["accelerator"] == "A100" and o["accelerator_count"] == 8 and o["source"] == "catalog"
               and o["stale"] is False for o in offers)
    on_demand = api.get("/v1/prices", params={"accelerator": "a100", "count": 8, "spot": "false",
                                             "cloud": "gcp", "max_price": 30}, headers=h).json()["offers"]
    assert on_demand and all(o["cloud"] == "gcp" and o["on_demand_price"] <= 30 for o in on_demand)
    assert [o["on_demand_price"] for o in on_demand] == sorted(o["on_demand_price"] for o in on_demand)


def test_an_accelerator_with_its_count_is_the_shape_the_cli_and_a_job_spec_take(api, team_headers):
    """`accelerator=A100:8` once answered 1-GPU offers: the count was dropped."""
    h = team_headers()
    shaped = api.get("/v1/prices", params={"accelerator": "A100:8"}, headers=h)
    apart = api.get("/v1/prices", params={"accelerator": "A100", "count": 8}, headers=h)
    def offers(r) -> list[dict]:  # an offer's age moves between the two requests
        return [{k: v for k, v in o.items() if k != "age_seconds"} for o in r.json()["offers"]]
    assert shaped.status_code == 200 and offers(shaped) and offers(shaped) == offers(apart)
    for params, field in (({"accelerator": "A100:8", "count": 4}, "count"), ({"accelerator": "A100:x"}, "accelerator"),
                          ({"accelerator": "A100:65"}, "accelerator"), ({"accelerator": "A100:0"}, "accelerator")):
        r = api.get("/v1/prices", params=params, headers=h)
        assert r.status_code == 422 and [e["field"] for e in r.json()["errors"]] == [field], (params, r.text)


def test_limit_and_cursor_page_through_every_offer_once(api, team_headers):
    h = team_headers()
    everything = api.get("/v1/prices", params={"limit": 1000}, headers=h).json()
    assert len(everything["offers"]) == 1000 and everything["next_cursor"]
    assert len(api.get("/v1/prices", headers=h).json()["offers"]) == 50  # the default limit
    seen, cursor = [], None
    while True:
        page = api.get("/v1/prices", params={"accelerator": "L4", "limit": 37, **({"cursor": cursor} if cursor
                                                                                  else {})}, headers=h).json()
        seen += [(o["cloud"], o["region"], o["zone"] or o["zone_id"], o["instance_type"]) for o in page["offers"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) > 37


def test_bad_queries_are_422_naming_the_field(api, team_headers):
    h = team_headers()
    for params, field in (({"limit": 1001}, "limit"), ({"limit": 0}, "limit"), ({"cloud": "ibm"}, "cloud"),
                          ({"cursor": "!!"}, "cursor"), ({"count": "many"}, "count"),
                          ({"max_price": -1}, "max_price"), ({"spot": "maybe"}, "spot")):
        r = api.get("/v1/prices", params=params, headers=h)
        assert r.status_code == 422, (params, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        assert field in [e["field"] for e in r.json()["errors"]]
    r = api.get("/v1/prices/history", params={"cloud": "aws"}, headers=h)
    assert r.status_code == 422 and {"zone", "instance_type"} <= {e["field"] for e in r.json()["errors"]}


def test_history_is_the_series_of_changes(api, team_headers, settings):
    h = team_headers()
    engine = make_engine(settings.sqlalchemy_url)
    factory = make_session_factory(engine)
    now = SYSTEM_CLOCK.now()
    for minutes, spot in ((10, 12.5), (20, 11.0), (30, 11.0), (40, 13.25)):
        row = OfferRow(cloud="aws", region="us-east-1", zone="us-east-1a", zone_id="use1-az6",
                       instance_type="p4d.24xlarge", accelerator="A100", accelerator_count=8, vcpus=96,
                       memory_gib=1152, spot_price=spot, ondemand_price=32.77)
        with transaction(factory) as s:
            store.apply_refresh(s, "aws", [row], now + timedelta(minutes=minutes), {"aws": frozenset({"us-east-1"})})
    engine.dispose()
    r = api.get("/v1/prices/history", params={"cloud": "aws", "zone": "us-east-1a",
                                               "instance_type": "p4d.24xlarge"}, headers=h)
    assert r.status_code == 200, r.text
    # The snapshot's price (the same offer, keyed by its zone id), then one
    # sample per change of the live source's price.
    assert [(s["source"], s["spot_price"]) for s in r.json()["samples"]] == [
        ("catalog", 7.8799), ("aws", 12.5), ("aws", 11.0), ("aws", 13.25)]
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    top = api.get("/v1/prices", params={"cloud": "aws", "region": "us-east-1", "accelerator": "A100",
                                        "count": 8}, headers=admin).json()["offers"]
    assert any(o["zone"] == "us-east-1a" and o["source"] == "aws" and o["spot_price"] == 13.25 for o in top)


def test_an_estimated_spot_price_says_so(api, team_headers, settings):
    """`aws-public`'s spot prices are estimates from the advisor's savings:
    its offers and their history say so."""
    engine = make_engine(settings.sqlalchemy_url)
    row = OfferRow(cloud="aws", region="us-east-1", zone=None, zone_id="use1-az6", instance_type="p4d.24xlarge",
                   accelerator="A100", accelerator_count=8, vcpus=96, memory_gib=1152, spot_price=9.83,
                   ondemand_price=21.96)
    with transaction(make_session_factory(engine)) as s:
        store.apply_refresh(s, "aws-public", [row], SYSTEM_CLOCK.now(), {"aws": frozenset({"us-east-1"})})
    engine.dispose()
    h = team_headers()
    offers = api.get("/v1/prices", params={"cloud": "aws", "region": "us-east-1", "accelerator": "A100",
                                           "count": 8}, headers=h).json()["offers"]
    label = "aws-public (spot estimated from advisor savings)"
    assert [o["source"] for o in offers if o["zone_id"] == "use1-az6"] == [label]
    samples = api.get("/v1/prices/history", params={"cloud": "aws", "zone": "use1-az6",
                                                    "instance_type": "p4d.24xlarge"}, headers=h).json()["samples"]
    assert [s["source"] for s in samples] == ["catalog", label]


def test_a_cursor_out_of_range_is_a_422_not_a_500(api, team_headers):
    headers = team_headers()
    # (an offer id of Infinity or a price of 10**400 raised OverflowError: a 500 and a traceback)
    for cursor in ([0, 1, 10**23], [0, 1, -(10**23)], [0, 1, -1], [0, "NaN", 5], [0, 1e400, 5],
                   [0, 1, "Infinity"], [0, 1, "-Infinity"], [0, 10**400, 5]):
        raw = json.dumps(cursor).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity").encode()
        r = api.get("/v1/prices", params={"cursor": base64.urlsafe_b64encode(raw).decode().rstrip("=")},
                    headers=headers)
        assert r.status_code == 422 and "cursor" in r.text, (cursor, r.text)


def test_the_history_of_an_offer_nobody_has_is_a_404_naming_where_it_is(api, team_headers):
    """A zone with no such offer answered an empty series, read as "the price
    never changed" (the snapshot knows zones by their ids alone)."""
    h = team_headers()
    r = api.get("/v1/prices/history", params={"cloud": "aws", "zone": "nope-zone", "instance_type": "p4d.24xlarge"},
                headers=h)
    assert r.status_code == 404, r.text
    detail = r.json()["detail"]
    assert detail.startswith("aws has no offer of p4d.24xlarge in nope-zone; it has one in: ") and "use1-az" in detail
    r = api.get("/v1/prices/history", params={"cloud": "aws", "zone": "use1-az6", "instance_type": "no.such"},
                headers=h)
    assert r.status_code == 404 and r.json()["detail"].endswith("it has none anywhere"), r.text
