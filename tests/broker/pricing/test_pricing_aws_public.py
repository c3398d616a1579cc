"""AWS prices with no credentials (`aws-public`): the Price List Bulk API's
region index and CSV offer files, and the Spot Instance Advisor feed, read
by the real client code over real HTTP from the local fake (real shapes,
files of a few MB each)."""
import logging
import threading
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from spotbroker.broker.pricing import risk, store
from spotbroker.broker.pricing.aws_price_list import BadOfferFile, read_offer_file
from spotbroker.broker.pricing.aws_public import AwsPublicSource
from spotbroker.broker.pricing.catalog import OfferRow, snapshot_rows
from spotbroker.broker.pricing.fakes import clouds as fakes
from spotbroker.broker.pricing.fakes import data as fake_data
from spotbroker.broker.pricing.fakes.price_list import EXTRA_REGIONS, HEADER, INDEX_PATH, PriceListFiles, render
from spotbroker.broker.pricing.normalise import QualityReport
from spotbroker.broker.pricing.offers import seed_from_catalog
from spotbroker.broker.pricing.settings import PricingSettings
from spotbroker.broker.pricing.tracker import PriceTracker
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import PriceListFile, PriceOffer

SNAPSHOT = [r for r in snapshot_rows() if r.cloud == "aws"]


class Clock:
    def __init__(self) -> None:
        self.at = datetime(2026, 11, 1, tzinfo=UTC)

    def now(self) -> datetime:
        return self.at


@pytest.fixture
def clouds():
    fake = fakes.FakeClouds(aws_advisor=fake_data.aws_advisor(), aws_price_list=PriceListFiles(mb=2)).start()
    yield fake
    fake.stop()


def settings(fake, **kw) -> PricingSettings:
    return PricingSettings(_env_file=None, aws_public_url=fake.url + INDEX_PATH,
                           aws_advisor_url=f"{fake.url}/spot-advisor-data.json", timeout=5, **kw)


def tracker(factory, fake, clock=None, owner=None, **kw) -> PriceTracker:
    s = settings(fake, **kw)
    return PriceTracker(factory, {"aws-public": AwsPublicSource(s, factory)}, s, clock=clock or Clock(), owner=owner)


def offers(factory, **where) -> list[PriceOffer]:
    with factory() as s:
        return list(s.scalars(select(PriceOffer).filter_by(cloud="aws", **where)))


def csv_downloads(fake) -> list[str]:
    return [path for path, status in fake.aws_price_list.answers if path.endswith(".csv")]


def saving(fake, region: str, itype: str) -> int:
    return fake.aws_advisor["spot_advisor"][region]["Linux"][itype]["s"]


def test_a_full_refresh_prices_every_snapshot_zone_from_the_files(factory, clouds):
    result = tracker(factory, clouds).refresh("aws-public", force=True)
    assert len(csv_downloads(clouds)) == len({r.region for r in SNAPSHOT})  # one file per region
    got = {(o.region, o.zone_id, o.instance_type): o for o in offers(factory)}
    listed = {(r.region, r.zone_id, r.instance_type): r for r in SNAPSHOT if r.ondemand_price}
    assert set(listed) <= set(got) and result.new == len(got)
    for key, row in listed.items():
        o = got[key]
        # The list price is the file's (the snapshot's, as the fake publishes
        # it); spot is the region-wide estimate from the advisor's saving.
        assert o.ondemand_price == row.ondemand_price and o.source == "aws-public" and o.listed
        assert o.spot_price == round(row.ondemand_price * (1 - saving(clouds, key[0], key[2]) / 100), 6)
        assert 0 < o.spot_price < o.ondemand_price
        assert (o.accelerator, o.accelerator_count) == (row.accelerator, row.accelerator_count)
        band = clouds.aws_advisor["spot_advisor"][key[0]]["Linux"][key[2]]["r"]
        assert (o.risk, o.risk_source) == (risk.from_advisor_band(band), "aws-advisor")
    # A GPU type the snapshot does not know: the family's GPU, the file's
    # count, offered region-wide (no zone known); on-demand only (the
    # advisor has no saving for it). An AMD type is not read, and said so.
    (gr6,) = offers(factory, region=EXTRA_REGIONS[0], instance_type="gr6.4xlarge")
    assert (gr6.place, gr6.zone_id, gr6.accelerator, gr6.accelerator_count) == ("", None, "L4", 1)
    assert gr6.spot_price is None and gr6.ondemand_price == 0.9
    assert not offers(factory, instance_type="g4ad.xlarge")
    assert result.quality.counts["GPU family not read (g4ad)"] == len(EXTRA_REGIONS)
    assert all((o.spot_price is None or o.spot_price > 0) and o.ondemand_price > 0 for o in offers(factory))


def test_the_cpu_families_are_read_and_a_file_kept_by_a_gpu_only_reader_is_read_again(factory, clouds):
    files = clouds.aws_price_list
    for itype, shape, price in (("m7i.large", (2, 8, "0"), 0.1008), ("m7i.metal-24xl", (96, 384, "0"), 4.8384)):
        files.types["us-east-1"][itype] = shape
        files.price[("us-east-1", itype)] = f"{price:.10f}"
    t = tracker(factory, clouds)
    t.refresh("aws-public", force=True)
    (m5,) = offers(factory, instance_type="m5.2xlarge", zone_id="use1-az1")
    assert (m5.accelerator, m5.accelerator_count, m5.vcpus, m5.ondemand_price) == (None, 0, 8, 0.384)
    assert m5.spot_price == round(0.384 * (1 - saving(clouds, "us-east-1", "m5.2xlarge") / 100), 6)
    # a size of the families the snapshot lacks: region-wide, the file's specs; a whole host (metal) is none
    (m7i,) = offers(factory, instance_type="m7i.large")
    assert (m7i.place, m7i.accelerator, m7i.vcpus, m7i.memory_gib, m7i.ondemand_price) == ("", None, 2, 8, 0.1008)
    assert not offers(factory, instance_type="m7i.metal-24xl") and not offers(factory, instance_type="m6a.large")
    # What a GPU-only reader kept (its version unstamped) is read again, though nothing new was published.
    with transaction(factory) as s:
        kept = s.get(PriceListFile, ("aws-public", "eu-west-1"))
        kept.version = kept.version.removeprefix("gpu+cpu:")
    downloaded = len(csv_downloads(clouds))
    t.refresh("aws-public", force=True)
    assert [p.rsplit("/", 2)[1] for p in csv_downloads(clouds)[downloaded:]] == ["eu-west-1"]


def test_nothing_published_since_costs_one_304_and_no_file_for_any_broker(factory, clouds):
    tracker(factory, clouds, owner="a").refresh("aws-public", force=True)
    first = len(csv_downloads(clouds))
    # Another broker on the same database: what the first read is in
    # `price_list_files`, not in the first one's memory.
    result = tracker(factory, clouds, owner="b").refresh("aws-public", force=True)
    assert result.unchanged == len(offers(factory)) and result.changed == 0
    assert len(csv_downloads(clouds)) == first
    assert clouds.aws_price_list.answers[-1] == (INDEX_PATH, 304)  # If-None-Match with the index's ETag
    # One region publishes a new version with a new price: only its file is read.
    clouds.aws_price_list.price[("eu-west-1", "p4d.24xlarge")] = "25.0000000000"
    clouds.aws_price_list.publish("eu-west-1", version="20251001000000")
    result = tracker(factory, clouds, owner="c").refresh("aws-public", force=True)
    assert csv_downloads(clouds)[first:] == ["/offers/v1.0/aws/AmazonEC2/20251001000000/eu-west-1/index.csv"]
    changed = offers(factory, region="eu-west-1", instance_type="p4d.24xlarge")
    assert changed and all(o.ondemand_price == 25.0 for o in changed)
    assert result.changed == len(changed)
    with factory() as s:
        kept = s.get(PriceListFile, ("aws-public", "eu-west-1"))
        assert kept.version.endswith("/20251001000000/eu-west-1/index.json")


def test_the_advisor_feed_is_asked_conditionally_and_its_last_copy_kept(factory, clouds):
    t = tracker(factory, clouds)
    t.refresh("aws-public", force=True)
    before = {(o.region, o.place, o.instance_type): o.spot_price for o in offers(factory)}
    clouds.aws_advisor = {"error": "gone"}  # the feed changed shape (or vanished): its last copy is used
    result = t.refresh("aws-public", force=True)
    assert result.quality.counts["no spot advisor feed (its last copy used)"] == 1
    assert {(o.region, o.place, o.instance_type): o.spot_price for o in offers(factory)} == before


def test_a_file_cut_off_mid_way_keeps_its_regions_previous_prices(factory, clouds, caplog):
    clock = Clock()
    t = tracker(factory, clouds, clock)
    t.refresh("aws-public", force=True)
    old = {(o.region, o.place, o.instance_type): (o.ondemand_price, o.checked_at) for o in offers(factory)}
    files = clouds.aws_price_list
    for key in list(files.price):  # every list price up 10 % in a new version of every file
        if files.price[key]:
            files.price[key] = f"{float(files.price[key]) * 1.1:.10f}"
    files.publish(version="20251101000000")
    files.fail_after["us-east-1"] = files.size("us-east-1") // 2
    clock.at += timedelta(days=1)
    with caplog.at_level(logging.WARNING, "spotbroker.pricing"):
        result = t.refresh("aws-public", force=True)
    assert "us-east-1's offer file failed (RemoteProtocolError" in caplog.text
    assert result.quality.counts["offer file failed (its region's offers keep their last prices)"] == 1
    now = {(o.region, o.place, o.instance_type): (o.ondemand_price, o.checked_at, o.listed) for o in offers(factory)}
    for key, (price, checked) in old.items():
        if key[0] == "us-east-1":  # untouched: not changed, not confirmed, not unlisted
            assert now[key] == (price, checked, True)
        else:
            assert now[key] == (pytest.approx(price * 1.1), clock.at, True)
    with factory() as s:  # its old version is what is remembered: the next refresh reads it again
        assert "/20250912225308/" in s.get(PriceListFile, ("aws-public", "us-east-1")).version
    del files.fail_after["us-east-1"]
    downloaded = len(csv_downloads(clouds))
    clock.at += timedelta(days=1)
    result = t.refresh("aws-public", force=True)
    assert csv_downloads(clouds)[downloaded:] == ["/offers/v1.0/aws/AmazonEC2/20251101000000/us-east-1/index.csv"]
    assert all(o.ondemand_price == pytest.approx(old[(o.region, o.place, o.instance_type)][0] * 1.1)
               for o in offers(factory, region="us-east-1") if (o.region, o.place, o.instance_type) in old)


def test_data_quality_rules(factory, clouds):
    files, advisor = clouds.aws_price_list, clouds.aws_advisor["spot_advisor"]
    files.currency[("us-east-1", "p5.48xlarge")] = "CNY"                     # not in USD
    files.price[("us-east-1", "g5.xlarge")] = "0.0000000000"                 # a placeholder zero
    files.price[("us-east-1", "g6.xlarge")] = ""                             # blank
    files.gpus["p4d.24xlarge"] = "4"                                         # the file's count is wrong
    advisor["us-west-2"]["Linux"]["g5.xlarge"]["s"] = 0                      # spot would equal on-demand
    advisor["us-west-2"]["Linux"]["g6.xlarge"]["s"] = -20                    # ... be above it
    advisor["us-west-2"]["Linux"]["g4dn.xlarge"]["s"] = 100                  # ... be free
    result = tracker(factory, clouds).refresh("aws-public", force=True)
    q = result.quality.counts
    assert not offers(factory, region="us-east-1", instance_type="p5.48xlarge") and q["not in USD (CNY)"] == 1
    assert not offers(factory, region="us-east-1", instance_type="g5.xlarge") and q["placeholder zero price"] >= 1
    assert not offers(factory, region="us-east-1", instance_type="g6.xlarge") and q["no price"] >= 1
    p4d = offers(factory, instance_type="p4d.24xlarge")
    assert p4d and all(o.accelerator_count == 8 for o in p4d)
    assert q["GPU count from the machine specs, not the price list"] >= len({o.region for o in p4d})
    for itype in ("g5.xlarge", "g6.xlarge", "g4dn.xlarge"):  # on-demand only, never spot >= on-demand or $0
        found = offers(factory, region="us-west-2", instance_type=itype)
        assert found and all(o.spot_price is None and o.ondemand_price > 0 for o in found)
    assert q["advisor saving out of range (no spot estimate)"] == 3
    assert all((o.spot_price is None or 0 < o.spot_price < o.ondemand_price) for o in offers(factory))


def test_a_region_the_index_no_longer_lists_is_unlisted(factory, clouds):
    with transaction(factory) as s:
        seed_from_catalog(s)
    del clouds.aws_price_list.files["af-south-1"]
    result = tracker(factory, clouds).refresh("aws-public", force=True)
    gone = offers(factory, region="af-south-1")
    assert gone and not any(o.listed for o in gone) and result.unlisted >= len(gone)
    assert all(o.listed and o.source == "aws-public" for o in offers(factory, region="eu-west-1"))


def test_the_live_aws_source_stays_the_authority_and_the_snapshot_never_overrides(factory, clouds):
    zone_id = next(r.zone_id for r in SNAPSHOT if (r.region, r.instance_type) == ("us-east-1", "p4d.24xlarge"))
    live = OfferRow(cloud="aws", region="us-east-1", zone="us-east-1a", zone_id=zone_id,
                    instance_type="p4d.24xlarge", accelerator="A100", accelerator_count=8, vcpus=96,
                    memory_gib=1152, spot_price=9.5, ondemand_price=21.96)
    clock = Clock()
    with transaction(factory) as s:
        store.apply_refresh(s, "aws", [live], clock.at, {"aws": frozenset({"us-east-1"})})
    result = tracker(factory, clouds, clock).refresh("aws-public", force=True)
    assert result.kept_live == 1
    (kept,) = offers(factory, region="us-east-1", place=zone_id, instance_type="p4d.24xlarge")
    assert (kept.source, kept.spot_price, kept.zone) == ("aws", 9.5, "us-east-1a")
    # The live source's next refresh of us-east-1 unlists the estimates it does not list ...
    with transaction(factory) as s:
        store.apply_refresh(s, "aws", [live], clock.at + timedelta(minutes=5), {"aws": frozenset({"us-east-1"})})
    assert {(o.source, o.listed) for o in offers(factory, region="us-east-1")} == {("aws", True), ("aws", False)}
    # ... and the snapshot never overrides the estimates elsewhere.
    estimates = {o.id: o.spot_price for o in offers(factory, source="aws-public")}
    with transaction(factory) as s:
        seed = store.apply_refresh(s, "catalog", SNAPSHOT, clock.at + timedelta(days=1), {"aws": None})
    assert seed.changed == 0 and seed.kept_live > 1000
    assert {o.id: o.spot_price for o in offers(factory, source="aws-public")} == estimates


def test_one_broker_reads_the_files_at_a_time(factory, clouds):
    """Two brokers on one database: while one holds the source's lease, the
    other neither refreshes nor downloads; after it, the files it read are
    not read again."""
    gate, entered = threading.Event(), threading.Event()

    class Held(AwsPublicSource):
        def fetch(self):
            entered.set()
            assert gate.wait(30)
            return super().fetch()

    s = settings(clouds, lease_seconds=60)
    a = PriceTracker(factory, {"aws-public": Held(s, factory)}, s, clock=Clock(), owner="a")
    b = tracker(factory, clouds, owner="b", lease_seconds=60)
    results = {}
    worker = threading.Thread(target=lambda: results.update(a=a.refresh("aws-public", force=True)))
    worker.start()
    try:
        assert entered.wait(30)
        assert b.refresh("aws-public", force=True) is None and clouds.aws_price_list.answers == []
    finally:
        gate.set()
        worker.join(60)
    assert results["a"].new > 1000
    downloaded = len(csv_downloads(clouds))
    assert b.refresh("aws-public", force=True).unchanged == results["a"].new
    assert len(csv_downloads(clouds)) == downloaded
    (lease,) = [x for x in b.status() if x.source == "aws-public"]
    assert (lease.owner, lease.last_error) == (None, None)


def test_offline_it_says_so_once_and_the_snapshot_stays(factory, caplog):
    with transaction(factory) as s:
        seed_from_catalog(s)
    s = PricingSettings(_env_file=None, timeout=2, aws_public_url="http://127.0.0.1:9/region_index.json",
                        aws_advisor_url="http://127.0.0.1:9/spot-advisor-data.json")
    clock = Clock()
    t = PriceTracker(factory, {"aws-public": AwsPublicSource(s, factory)}, s, clock=clock)
    before = {(o.region, o.place, o.instance_type, o.spot_price, o.listed, o.source) for o in offers(factory)}
    with caplog.at_level(logging.WARNING, "spotbroker.pricing"):
        for _ in range(3):
            assert t.refresh("aws-public", force=True) is None
            clock.at += timedelta(days=1)
    assert caplog.text.count("aws-public skipped (AWS price list unreachable") == 1
    assert {(o.region, o.place, o.instance_type, o.spot_price, o.listed, o.source) for o in offers(factory)} == before


def test_a_file_that_is_not_an_offer_file_is_refused():
    def chunks(*lines):
        return [("\n".join(lines) + "\n").encode()]

    with pytest.raises(BadOfferFile, match="no header"):
        read_offer_file(chunks("<html>Service Unavailable</html>"), "us-east-1", QualityReport())
    with pytest.raises(BadOfferFile, match="no column"):
        read_offer_file(chunks('"FormatVersion","v1.0"', '"SKU","TermType"'), "us-east-1", QualityReport())
    # GPU rows, none billed as `BoxUsage`: the file's layout moved, and an
    # empty answer would unlist the region; it is refused instead.
    row = render({"SKU": "X", "TermType": "OnDemand", "Instance Type": "p5.48xlarge", "Instance Family": "GPU instance",
                  "usageType": "USE1-InstanceHours:p5.48xlarge", "Unit": "Hrs", "PricePerUnit": "55.04"})
    with pytest.raises(BadOfferFile, match="BoxUsage"):
        read_offer_file(chunks('"Version","1"', ",".join(f'"{c}"' for c in HEADER), row.decode().rstrip()),
                        "us-east-1", QualityReport())
