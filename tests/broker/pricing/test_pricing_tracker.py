"""The tracker: due intervals, one refresher per source across brokers (a
lease), unavailable and failing sources, and refreshes off the caller's path."""
import logging
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from spotbroker.broker.pricing.base import SourceAnswer, SourceUnavailable
from spotbroker.broker.pricing.catalog import OfferRow
from spotbroker.broker.pricing.query import is_fresh
from spotbroker.broker.pricing.settings import PricingSettings
from spotbroker.broker.pricing.tracker import PriceTracker
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import PriceOffer, PriceSourceLease, Team

T0 = datetime(2026, 11, 1, tzinfo=UTC)
ROW = OfferRow(cloud="aws", region="us-east-1", zone="us-east-1a", zone_id="use1-az6", instance_type="p4d.24xlarge",
               accelerator="A100", accelerator_count=8, vcpus=96, memory_gib=1152, spot_price=10.0,
               ondemand_price=32.77)


class Clock:
    def __init__(self) -> None:
        self.at = T0

    def now(self) -> datetime:
        return self.at


class Fake:
    """A source whose answer, failure or wait the test sets."""

    name = "aws"

    def __init__(self, rows=(ROW,)) -> None:
        self.rows, self.error, self.calls = list(rows), None, 0
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def fetch(self) -> SourceAnswer:
        self.calls += 1
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(30)
        if self.error is not None:
            raise self.error
        return SourceAnswer(list(self.rows), {"aws": None})


SETTINGS = PricingSettings(_env_file=None, aws_interval=300, lease_seconds=60)


def tracker(factory, source, clock, owner="a"):
    return PriceTracker(factory, {"aws": source}, SETTINGS, clock=clock, owner=owner)


def offer(factory) -> PriceOffer:
    with factory() as s:
        return s.scalar(select(PriceOffer))


def test_a_source_is_refreshed_once_per_interval(factory):
    clock, source = Clock(), Fake()
    t = tracker(factory, source, clock)
    assert t.refresh("aws").new == 1
    clock.at += timedelta(seconds=60)
    assert t.refresh("aws") is None and source.calls == 1          # not due
    assert t.refresh("aws", force=True).unchanged == 1              # --refresh
    clock.at += timedelta(seconds=300)
    source.rows = [replace(ROW, spot_price=9.0)]
    assert t.refresh("aws").changed == 1
    (lease,) = t.status()
    assert (lease.owner, lease.last_ok_at, lease.last_error) == (None, clock.at, None)


def test_one_refresher_per_source_across_brokers(factory):
    clock, slow = Clock(), Fake()
    slow.gate = threading.Event()
    a, b = tracker(factory, slow, clock, "a"), tracker(factory, Fake(), clock, "b")
    done = []
    worker = threading.Thread(target=lambda: done.append(a.refresh("aws")))
    worker.start()
    assert slow.entered.wait(10)
    # Broker b, even forced, stays off while a holds the lease...
    assert b.refresh("aws", force=True) is None
    # ...and the database is free meanwhile: the fetch holds no transaction.
    with transaction(factory) as s:
        s.add(Team(name="busy", created_at=T0))
    slow.gate.set()
    worker.join(10)
    assert done[0].new == 1
    clock.at += timedelta(seconds=30)
    assert b.refresh("aws") is None  # a refreshed it just now: not due for anyone
    clock.at += timedelta(seconds=300)
    assert b.refresh("aws").unchanged == 1


def test_an_expired_lease_is_taken_over(factory):
    clock = Clock()
    with transaction(factory) as s:
        s.add(PriceSourceLease(source="aws", owner="crashed", expires_at=T0 + timedelta(seconds=60)))
    t = tracker(factory, Fake(), clock)
    assert t.refresh("aws", force=True) is None
    clock.at += timedelta(seconds=61)
    assert t.refresh("aws", force=True).new == 1


def test_an_unavailable_source_is_skipped_with_one_log_line(factory, caplog):
    clock, source = Clock(), Fake()
    t = tracker(factory, source, clock)
    t.refresh("aws")
    source.error = SourceUnavailable("no AWS credentials found")
    with caplog.at_level(logging.WARNING, logger="spotbroker.pricing"):
        for _ in range(3):
            clock.at += timedelta(seconds=300)
            assert t.refresh("aws") is None
    assert [r.getMessage() for r in caplog.records].count(
        "prices: aws skipped (no AWS credentials found); its offers keep their last prices") == 1
    assert offer(factory).spot_price == 10.0
    (lease,) = t.status()
    assert lease.last_error == "no AWS credentials found"


def test_a_refresh_failing_midway_keeps_the_previous_prices_which_turn_stale(factory):
    clock, source = Clock(), Fake([ROW, replace(ROW, zone="us-east-1b", zone_id="use1-az1")])
    t = tracker(factory, source, clock)
    t.refresh("aws")
    source.error = ConnectionError("page 3 of 5: connection reset")
    clock.at += timedelta(seconds=300)
    assert t.refresh("aws") is None
    with factory() as s:
        offers = list(s.scalars(select(PriceOffer)))
    assert {(o.spot_price, o.listed) for o in offers} == {(10.0, True)}
    assert all(is_fresh(o, SETTINGS, clock.now()) for o in offers)
    assert not any(is_fresh(o, SETTINGS, clock.now() + timedelta(seconds=900)) for o in offers)


def test_sources_run_in_their_own_threads(factory):
    stuck, quick = Fake(), Fake([replace(ROW, cloud="gcp", region="us-central1", zone="us-central1-a")])
    stuck.gate = threading.Event()
    t = PriceTracker(factory, {"aws": stuck, "gcp": quick}, SETTINGS, clock=Clock())
    stop = threading.Event()
    threads = t.start(stop)
    try:
        assert stuck.entered.wait(10)
        from support.helpers import wait_for

        wait_for(lambda: offer(factory), what="the gcp refresh beside a stuck aws one")
        assert offer(factory).cloud == "gcp"
    finally:
        stop.set()
        stuck.gate.set()
        for th in threads:
            th.join(10)
