"""AWS through boto3 over real HTTP: EC2 is moto's server (with realistic
spot prices injected: moto's own are placeholders), the Pricing API, the
placement scores and the Spot Instance Advisor feed are the local fake."""
import fnmatch
import functools
from datetime import UTC, datetime, timedelta

import boto3
import pytest
from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend
from moto.ec2.models.instance_types import INSTANCE_TYPES
from moto.server import ThreadedMotoServer
from sqlalchemy import select

from spotbroker.broker.pricing.aws import LISTED_TYPES, AwsSource
from spotbroker.broker.pricing.base import SourceUnavailable
from spotbroker.broker.pricing.cpu_families import AWS_FAMILIES, aws_cpu_type
from spotbroker.broker.pricing.fakes import clouds as fakes
from spotbroker.broker.pricing.fakes import data as fake_data
from spotbroker.broker.pricing.offers import seed_from_catalog
from spotbroker.broker.pricing.settings import PricingSettings
from spotbroker.broker.pricing.tracker import PriceTracker
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import PriceOffer

NOW = datetime.now(UTC)


def zone_names() -> dict[str, str]:
    return {z.zone_id: z.name for zones in RegionsAndZonesBackend.zones.values() for z in zones}


def injected_prices() -> dict[tuple[str, str], list[tuple[datetime, float]]]:
    """Each snapshot spot price as the newest of two samples (an older,
    dearer one first), under moto's zone names."""
    names = zone_names()
    return {(names[zid], itype): [(NOW - timedelta(hours=3), round(price * 1.2, 6)),
                                  (NOW - timedelta(minutes=10), price)]
            for (zid, itype), price in fake_data.aws_spot_prices().items() if zid in names}


@pytest.fixture(scope="module")
def moto_url():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def clouds():
    fake = fakes.FakeClouds(aws_products=fake_data.aws_products(), aws_advisor=fake_data.aws_advisor(),
                            aws_scores={"use1-az6": ("us-east-1", 9), "use1-az4": ("us-east-1", 2)}).start()
    with fakes.moto_spot_prices(injected_prices()):
        yield fake
    fake.stop()


def settings(moto_url, fake, **kw):
    # A generous timeout: moto and the fake share a busy machine (a 30 s one timed out once,
    # moto serialising DescribeInstanceTypes with five workers on two slow cores).
    return PricingSettings(_env_file=None, aws_endpoint_url=moto_url, aws_pricing_endpoint_url=fake.url,
                           aws_scores_endpoint_url=fake.url, aws_advisor_url=f"{fake.url}/spot-advisor-data.json",
                           timeout=120, **kw)


@functools.cache
def session():
    """One for the module: a session loads each service's model once, for all its clients
    (a new session per test loaded EC2's again for each of the 17 regions' clients)."""
    return boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing")


def refresh(factory, src):
    t = PriceTracker(factory, {"aws": src}, PricingSettings(_env_file=None))
    return t.refresh("aws", force=True)


def offers(factory, **where):
    with factory() as s:
        return list(s.scalars(select(PriceOffer).filter_by(cloud="aws", **where)))


def test_spot_on_demand_specs_and_risk_from_every_region(factory, moto_url, clouds):
    result = refresh(factory, AwsSource(settings(moto_url, clouds), session=session()))
    assert result.new > 800
    regions = {o.region for o in offers(factory)}
    assert {"us-east-1", "eu-west-1", "ap-northeast-1"} <= regions
    (p4d,) = offers(factory, instance_type="p4d.24xlarge", zone_id="use1-az6")
    newest = fake_data.aws_spot_prices()[("use1-az6", "p4d.24xlarge")]
    assert p4d.zone == "us-east-1a" and p4d.spot_price == newest  # the newest sample, not the older dearer one
    assert p4d.ondemand_price == 21.957642 and (p4d.accelerator, p4d.accelerator_count, p4d.vcpus) == ("A100", 8, 96)
    (p4de,) = offers(factory, instance_type="p4de.24xlarge", zone_id="use1-az6") or [None]
    assert p4de is None or p4de.accelerator == "A100-80GB"
    # Risk: the advisor band per region and type, the placement score per AZ.
    assert p4d.risk is not None and p4d.risk_source.startswith("aws-advisor")
    low = offers(factory, instance_type="g5.xlarge", zone_id="use1-az6")[0]
    high = offers(factory, instance_type="g5.xlarge", zone_id="use1-az4")[0]
    assert high.risk >= 0.2 and high.risk > low.risk


def test_the_types_listed_are_every_nvidia_type_and_cpu_type_aws_has():
    """The specs are asked for with a filter on the type's name (LISTED_TYPES):
    it must let through every NVIDIA GPU type and every CPU type the source
    prices, here among the 1,395 types of moto's copy of AWS's list."""
    def listed(name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in LISTED_TYPES["Values"])

    nvidia = {name for name, t in INSTANCE_TYPES.items()
              if ((t.get("GpuInfo") or {}).get("Gpus") or [{}])[0].get("Manufacturer") == "NVIDIA"}
    cpu = {name for name in INSTANCE_TYPES if aws_cpu_type(name)}
    assert len(nvidia) > 50 and len(cpu) > 50
    assert {name for name in nvidia | cpu if not listed(name)} == set()
    assert sum(map(listed, INSTANCE_TYPES)) < len(INSTANCE_TYPES) / 5  # and it is a filter


def test_the_catalogs_aws_rows_give_way_to_the_live_source(factory, moto_url, clouds):
    with transaction(factory) as s:
        seed_from_catalog(s)
    before = len(offers(factory, listed=True))
    result = refresh(factory, AwsSource(settings(moto_url, clouds), session=session()))
    # Same keys (zone ids) and the snapshot's prices: the same offers, now
    # owned by the live source, and no history sample for an unchanged price.
    assert result.unchanged > 500 and result.samples == result.new
    live = offers(factory, listed=True)
    assert {o.source for o in live} == {"aws"} and 0 < before - len(live) < before


def test_the_cpu_families_are_offers_too(factory, moto_url, clouds):
    refresh(factory, AwsSource(settings(moto_url, clouds, aws_regions=["us-east-1"]), session=session()))
    (m5,) = offers(factory, instance_type="m5.2xlarge", zone_id="use1-az1")
    assert (m5.accelerator, m5.accelerator_count, m5.vcpus, m5.memory_gib) == (None, 0, 8, 32)
    assert (m5.spot_price, m5.ondemand_price) == (fake_data.aws_spot_prices()[("use1-az1", "m5.2xlarge")], 0.384)
    # the advisor's band for the type; a placement score is asked for GPU types only
    assert m5.risk_source == "aws-advisor"
    cpu_types = {o.instance_type for o in offers(factory) if o.accelerator is None}
    assert {"m5.large", "m5.4xlarge", "c6i.2xlarge", "c6i.4xlarge", "r6i.large"} <= cpu_types
    assert all(t.split(".")[0] in AWS_FAMILIES for t in cpu_types)


def test_on_demand_prices_are_cached_for_the_list_interval(factory, moto_url, clouds):
    src = AwsSource(settings(moto_url, clouds, aws_regions=["us-east-1"]), session=session())
    refresh(factory, src)
    asked = clouds.requests.count("POST /")
    refresh(factory, src)
    assert clouds.requests.count("POST /") - asked == 1  # the placement scores only


def test_no_credentials_is_unavailable_not_a_crash(moto_url, clouds, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(SourceUnavailable, match="no AWS credentials"):
        AwsSource(settings(moto_url, clouds)).fetch()


def test_a_failing_pricing_page_fails_the_whole_refresh(factory, moto_url, clouds):
    clouds.page_size, clouds.fail_page = 1, 1
    src = AwsSource(settings(moto_url, clouds, aws_regions=["us-east-1"]), session=session())
    assert refresh(factory, src) is None
    assert offers(factory) == []
