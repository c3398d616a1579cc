"""Which accelerator names some offer has (what a submission is checked
against): read from the offers, kept a while, looked up again before a name
is refused, and nothing refused while no offer is known at all."""
from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import delete

from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.pricing.known import KnownAccelerators
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import PriceOffer


def offer(accelerator: str | None, count: float = 1) -> PriceOffer:
    now = datetime.now(UTC)
    return PriceOffer(cloud="aws", region="us-east-1", place="us-east-1a", zone="us-east-1a", zone_id="use1-az1",
                      instance_type=f"x.{accelerator}.{count:g}", accelerator=accelerator, accelerator_count=count,
                      spot_price=0.2, ondemand_price=0.5, observed_at=now, checked_at=now, source="test",
                      listed=True)


def spec(accelerators: str, **resources) -> JobSpec:
    return JobSpec.model_validate({"run": "x", "resources": {"accelerators": accelerators, **resources}})


def test_a_name_is_refused_only_when_offers_are_known_and_none_has_it(factory):
    known = KnownAccelerators(factory, also=["MI300X"])
    assert known.errors(spec("Z9:1")) == []  # no offer at all yet: nothing to tell by
    with transaction(factory) as s:
        s.add_all([offer("T4"), offer("H100"), offer(None)])
    known = KnownAccelerators(factory, also=["MI300X"])
    assert known.errors(spec("t4:1")) == [] and known.errors(spec("MI300X:8")) == []
    (err,) = known.errors(spec("H10:8"))
    assert err["field"] == "resources.accelerators" and "did you mean H100?" in err["message"], err
    assert known.errors(spec("Z9:1", infra="local")) == []  # the broker's host: no offers there
    flight = JobSpec.model_validate({"run": "x", "resources": {"accelerators": "H100:1"},
                                     "preflight": {"accelerators": "T5:1"}})
    assert [e["field"] for e in known.errors(flight)] == ["preflight.accelerators"]


def test_a_name_is_one_only_as_a_whole_never_a_shorter_one_with_a_suffix_ignored(factory):
    """`A100-80G` (a typo of A100-80GB) was read as `A100` and ran on 40 GB parts."""
    with transaction(factory) as s:
        s.add_all([offer("A100", 8), offer("A100-80GB", 8), offer("T4")])
    known = KnownAccelerators(factory)
    for typo in ("A100-80G:8", "A100-80:8", "A100_80G:8"):
        (err,) = known.errors(spec(typo))
        assert "did you mean" in err["message"] and "A100-80GB" in err["message"], err
    for spelled in ("A100-80GB:8", "a100_80gb:8", "A100-40GB:8", "a100:8", "nvidia-tesla-t4:1"):
        assert known.errors(spec(spelled)) == [], spelled


def test_a_name_listed_after_the_last_read_is_accepted(factory):
    with transaction(factory) as s:
        s.add(offer("T4"))
    known = KnownAccelerators(factory, ttl_s=3600)
    assert known.errors(spec("T4:1")) == []
    with transaction(factory) as s:
        s.add(offer("L40S"))
    known._read_at -= 2  # the names are more than a second old: a miss reads them again
    assert known.errors(spec("L40S:1")) == []
    with transaction(factory) as s:
        s.execute(delete(PriceOffer))
        s.add(offer("T4"))
    known._read_at -= 3600
    # A set no offer has, beside one that fits, is passed over with a warning, as SkyPilot passes it over.
    errors, (warning,) = known.judge(JobSpec.model_validate({"run": "x", "resources": {
        "accelerators": "T4:1", "any_of": [{"cpus": "4"}, {"accelerators": "L40S:1"}]}}))
    assert errors == [] and warning["field"] == "resources.any_of.1.accelerators", warning
    assert warning["message"].endswith("passed over, the others are placed"), warning
    errors, (warning,) = known.judge(JobSpec.model_validate({"run": "x", "resources": {
        "accelerators": "L40S:1", "any_of": [{"cpus": "4"}, {"accelerators": "T4:1"}]}}))
    assert warning["field"] == "resources.accelerators", warning  # where it is written, not the alternative it fills
    errors, warnings = known.judge(JobSpec.model_validate({"run": "x", "resources": {"any_of": [
        {"accelerators": "L40S:1"}, {"accelerators": "T4:2"}]}}))  # nothing fits: each is an error
    assert [e["field"] for e in errors] == ["resources.any_of.0.accelerators", "resources.any_of.1.accelerators"]
    assert warnings == []


def test_a_count_per_node_no_machine_has_is_refused_with_the_counts_offered(factory):
    """Placement matches a count exactly (as SkyPilot does): `A100:3` or
    `T4:0.5` was accepted, then FAILED no_feasible_offer."""
    with transaction(factory) as s:
        s.add_all([offer("A100", 1), offer("A100", 8), offer("A10", 1 / 6)])
    known = KnownAccelerators(factory, also=["MI300X"])
    assert known.errors(spec("A100:8")) == [] and known.errors(spec(f"A10:{1 / 6}")) == []
    (err,) = known.errors(spec("A100:3"))
    assert err == {"field": "resources.accelerators", "message": "no machine offers 3 A100 per node (offered: 1, 8)"}
    (err,) = known.errors(spec("a100:0.5"))
    assert "0.5 A100 per node" in err["message"], err
    assert known.errors(spec("MI300X:3")) == []  # the operator's Kubernetes nodes: any count
    assert known.errors(spec("A100:3", infra="k8s")) == []
    # a set that fits is where the job runs: the others' counts are passed over, as SkyPilot does
    assert known.errors(spec("A100:3", any_of=[{"accelerators": "A100:8"}, {"accelerators": "A100:3"}])) == []
    assert len(known.errors(spec("A100:3", any_of=[{"accelerators": "A100:2"}, {"accelerators": "A100:3"}]))) == 2
    flight = JobSpec.model_validate({"run": "x", "resources": {"accelerators": "A100:8"},
                                     "preflight": {"accelerators": "A100:2"}})
    assert [e["field"] for e in known.errors(flight)] == ["preflight.accelerators"]
    with transaction(factory) as s:
        s.add(offer("A100", 4))
    known._read_at -= 2  # a count listed since the last read is looked up once more
    assert known.errors(spec("A100:4")) == []
