"""The SkyPilot launcher through real SkyPilot (its API server, its AWS
provisioner) against moto's EC2 in this process (see skyenv.py).

moto starts no machine: SkyPilot's launch would wait 600 s (hard-coded) for
SSH. These tests stop at what SkyPilot does before SSH (the EC2 instance
with the pinned type, zone and market), and use the launcher's bound to
cancel the launch; what the node runs after SSH is test_node_program.py's.
"""
from __future__ import annotations

import time
from dataclasses import replace

import pytest
from support.skyenv import SkyAws

from spotbroker.broker.jobs.runs import RunState
from spotbroker.broker.launch.base import CapacityError, LauncherUnavailable, LaunchRequest, UnknownPlace
from spotbroker.broker.pricing.offers import Placement

pytestmark = pytest.mark.timeout(600)


def placement(zone: str = "us-east-1b", spot: bool = True) -> Placement:
    return Placement(cloud="aws", region="us-east-1", zone=zone, zone_id=None, instance_type="g4dn.xlarge",
                     accelerator="T4", accelerator_count=1, use_spot=spot, price_per_hour=0.2)


def request(attempt_id: int, where: Placement) -> LaunchRequest:
    return LaunchRequest(attempt_id=attempt_id, job_id=1, team="t", run="python train.py", setup="echo hi",
                         envs={"EPOCHS": "3"}, num_nodes=1, placement=where,
                         extra_env={"SPOTBROKER_AGENT_TOKEN": "secret-token", "SPOTBROKER_ATTEMPT_ID": str(attempt_id)})


@pytest.fixture(scope="module")
def launcher(sky_aws: SkyAws, tmp_path_factory):
    from spotbroker.broker.launch.skypilot.launcher import SkyPilotLauncher

    wheels = tmp_path_factory.mktemp("wheels")
    (wheels / "spotbroker-0.1.0-py3-none-any.whl").write_bytes(b"")
    launcher = SkyPilotLauncher(wheels, prefix=f"sbt{int(time.time()) % 100000}", launch_timeout_s=150,
                                poll_s=0.2, cluster_poll_s=1.0)
    launcher.server.probe()  # a launch never starts SkyPilot's server: in a broker, the janitor's thread does
    yield launcher
    launcher.close()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_task_passes_validation_and_a_dry_run(sky_aws: SkyAws, launcher) -> None:
    import sky

    task = launcher.task(request(1, placement()))
    task.validate()
    (resources,) = task.resources
    assert (resources.instance_type, resources.zone, resources.use_spot) == ("g4dn.xlarge", "us-east-1b", True)
    assert "secret-token" not in str(task.envs)
    assert sky.get(sky.launch(task, cluster_name=f"{launcher.prefix}-1", dryrun=True)) == (None, None)


def test_the_enabled_clouds_are_what_sky_check_enabled(sky_aws: SkyAws, launcher) -> None:
    # moto's AWS is the one cloud with credentials here
    assert launcher.enabled_clouds() is None  # not asked yet: no limit
    assert launcher.refresh_clouds() == frozenset({"aws"})
    assert launcher.enabled_clouds() == frozenset({"aws"})


def test_a_launch_creates_the_pinned_instance_and_down_removes_it(sky_aws: SkyAws, launcher) -> None:
    started = time.monotonic()
    handle = launcher.launch(request(2, placement("us-east-1c")))
    # A launch that waited for the node would take the whole provisioning (tens of seconds against
    # moto); sending the request takes seconds, up to 17 s seen on a loaded slow machine.
    assert time.monotonic() - started < 30, "launch waits for nothing but the request"
    assert launcher.status(handle).state == RunState.PENDING
    (instance,) = wait_for(sky_aws.instances, 90, "the instance in moto")
    assert instance["InstanceType"] == "g4dn.xlarge"
    assert instance["Placement"]["AvailabilityZone"] == "us-east-1c"
    assert instance.get("InstanceLifecycle") == "spot"
    launcher.terminate(handle)
    wait_for(lambda: not sky_aws.instances(), 90, "no instance left")


def test_a_capacity_refusal_is_seen_and_the_next_place_launches(sky_aws: SkyAws, launcher) -> None:
    from support.skyenv import refuse_capacity

    with refuse_capacity("us-east-1a"):
        handle = launcher.launch(request(3, placement("us-east-1a")))
        status = wait_for(lambda: (s := launcher.status(handle)).state != RunState.PENDING and s, 240,
                          "the capacity refusal")
        seen = time.monotonic()
        assert status.state == RunState.FAILED and status.capacity, status
        assert "us-east-1a" in status.error or "capacity" in status.error.lower()
        assert not sky_aws.instances()
        launcher.terminate(handle)  # the failed launch's cluster (INIT) goes too
        nxt = launcher.launch(request(4, placement("us-east-1b")))
        assert time.monotonic() - seen < 30  # sending a request, as above
    (instance,) = wait_for(sky_aws.instances, 90, "the instance in the next zone")
    assert instance["Placement"]["AvailabilityZone"] == "us-east-1b"
    launcher.terminate(nxt)
    wait_for(lambda: not sky_aws.instances(), 90, "no instance left")


def test_a_launch_past_its_bound_is_cancelled_and_downed(sky_aws: SkyAws, launcher, monkeypatch) -> None:
    import sky

    handle = launcher.launch(request(5, placement("us-east-1c", spot=False)))
    (instance,) = wait_for(sky_aws.instances, 90, "the instance in moto")
    assert "InstanceLifecycle" not in instance  # on-demand, as pinned
    monkeypatch.setattr(launcher, "launch_timeout_s", 1.0)
    status = launcher.status(handle)  # the launch waits for SSH that moto never answers
    assert status.state == RunState.FAILED and status.capacity and "no node in 1 s" in status.error
    launcher.terminate(handle)
    wait_for(lambda: not sky_aws.instances(), 90, "no instance left")
    with pytest.raises(sky.exceptions.RequestCancelled):
        sky.get(handle["request_id"])
    # `terminate` sends `sky.down` without waiting: the cluster's record goes when it is done
    wait_for(lambda: sky.get(sky.status(cluster_names=[handle["cluster"]])) == [], 60, "the cluster's record gone")


def test_a_broker_killed_mid_launch_reattaches_without_a_second_instance(sky_aws: SkyAws, launcher,
                                                                           tmp_path) -> None:
    import subprocess
    import sys

    from spotbroker.broker.launch.skypilot.launcher import SkyPilotLauncher

    # A broker process that sends the launch and dies before storing its handle.
    script = (
        "import os, signal, sys; sys.path.insert(0, 'tests')\n"
        "from pathlib import Path\n"
        "from spotbroker.broker.launch.skypilot.launcher import SkyPilotLauncher\n"
        "from skypilot.test_launch_moto import placement, request\n"
        f"l = SkyPilotLauncher(Path({str(launcher.wheelhouse)!r}), prefix={launcher.prefix!r})\n"
        "l.launch(request(6, placement('us-east-1b')))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    died = subprocess.run([sys.executable, "-c", script], timeout=120)
    assert died.returncode == -9
    again = SkyPilotLauncher(launcher.wheelhouse, prefix=launcher.prefix, poll_s=0.2, cluster_poll_s=1.0)
    try:
        handle = again.launch(request(6, placement("us-east-1b")))
        wait_for(sky_aws.instances, 90, "the instance in moto")
        time.sleep(3)
        assert len(sky_aws.instances()) == 1, "launched once"
        assert again.status(handle).state == RunState.PENDING
        again.terminate(handle)
        wait_for(lambda: not sky_aws.instances(), 90, "no instance left")
    finally:
        again.close()


def test_the_janitor_downs_a_cluster_no_live_attempt_owns(sky_aws: SkyAws, launcher, tmp_path) -> None:
    from spotbroker.broker.launch.skypilot.janitor import sweep
    from spotbroker.broker.store import migrate
    from spotbroker.broker.store.db import make_engine, make_session_factory

    engine = make_engine(f"sqlite:///{tmp_path / 'broker.db'}")
    migrate.prepare(engine, tmp_path)
    orphan = launcher.launch(request(7, placement("us-east-1b")))  # attempt 7 is in no broker's table
    wait_for(sky_aws.instances, 90, "the instance in moto")
    try:
        assert sweep(launcher, make_session_factory(engine)) == [orphan["cluster"]]
        wait_for(lambda: not sky_aws.instances(), 90, "no instance left")
    finally:
        engine.dispose()


def test_a_cpu_task_naming_aws_launches_the_chosen_cpu_type_in_the_chosen_zone(sky_aws: SkyAws, launcher,
                                                                                  tmp_path) -> None:
    """Issue #23: a task without accelerators is placed among AWS's CPU offers
    by the broker's ranking and launched there, never run on the broker's host."""
    from datetime import UTC, datetime

    from support.skyenv import ZONES

    from spotbroker.broker.jobs.spec import JobSpec
    from spotbroker.broker.pricing.catalog import OfferRow
    from spotbroker.broker.pricing.offers import rank_offers, record_samples
    from spotbroker.broker.store import migrate
    from spotbroker.broker.store.db import make_engine, make_session_factory, transaction

    engine = make_engine(f"sqlite:///{tmp_path / 'broker.db'}")
    migrate.prepare(engine, tmp_path)
    factory = make_session_factory(engine)
    # m6i.large in moto's three zones, as the live AWS source lists them (names and ids); us-east-1c is cheapest
    spot = {"us-east-1a": 0.041, "us-east-1b": 0.043, "us-east-1c": 0.0312}
    rows = [OfferRow(cloud="aws", region="us-east-1", zone=zone, zone_id=zone_id, instance_type="m6i.large",
                     accelerator=None, accelerator_count=0.0, vcpus=2.0, memory_gib=8.0, spot_price=spot[zone],
                     ondemand_price=0.096) for zone, zone_id in ZONES.items()]
    spec = JobSpec.model_validate({"run": "python train.py", "resources": {"infra": "aws", "cpus": 2}})
    try:
        with transaction(factory) as s:
            record_samples(s, rows, "aws", datetime.now(UTC))
        with factory() as s:
            chosen = rank_offers(s, spec, limit=1)[0]
        assert (chosen.cloud, chosen.zone, chosen.instance_type, chosen.accelerator) == \
            ("aws", "us-east-1c", "m6i.large", None)
        req = replace(request(20, chosen), spec=spec)
        task = launcher.task(req)
        (resources,) = task.resources
        assert (resources.instance_type, resources.zone, resources.accelerators) == ("m6i.large", "us-east-1c", None)
        handle = launcher.launch(req)
        (instance,) = wait_for(sky_aws.instances, 90, "the instance in moto")
        assert instance["InstanceType"] == "m6i.large"
        assert instance["Placement"]["AvailabilityZone"] == "us-east-1c"
        assert instance.get("InstanceLifecycle") == "spot"
        launcher.terminate(handle)
        wait_for(lambda: not sky_aws.instances(), 90, "no instance left")
    finally:
        engine.dispose()


def test_a_zone_id_placement_lands_in_that_zone(sky_aws: SkyAws, launcher) -> None:
    # The catalog names AWS zones by ID; the launch must name the zone the
    # policy chose (moto's us-east-1 maps use1-az2 to us-east-1c), not the region.
    by_id = Placement(cloud="aws", region="us-east-1", zone=None, zone_id="use1-az2", instance_type="g4dn.xlarge",
                      accelerator="T4", accelerator_count=1, use_spot=True, price_per_hour=0.2)
    zone = {z["ZoneId"]: z["ZoneName"] for z in sky_aws.ec2().describe_availability_zones()["AvailabilityZones"]}
    assert zone["use1-az2"] == "us-east-1c"
    # A job that names the zone as SkyPilot does: its resource set is found by the name (it was
    # judged before the ID was named, and refused as fitting none of the job's sets).
    from spotbroker.broker.jobs.spec import JobSpec

    named = JobSpec.model_validate({"run": "x", "resources": {"infra": "aws/us-east-1/us-east-1c",
                                                              "accelerators": "T4:1", "use_spot": True}})
    (resources,) = launcher.task(replace(request(8, by_id), spec=named)).resources
    assert (resources.zone, resources.instance_type) == ("us-east-1c", "g4dn.xlarge")
    handle = launcher.launch(request(8, by_id))
    (instance,) = wait_for(sky_aws.instances, 90, "the instance in moto")
    assert instance["Placement"]["AvailabilityZone"] == "us-east-1c"
    launcher.terminate(handle)
    wait_for(lambda: not sky_aws.instances(), 90, "no instance left")
    # A place the account or SkyPilot's catalog does not have: the next place is
    # tried (a CapacityError), never the job failed (a Local Zone not opted in to).
    unknown = Placement(**{**by_id.__dict__, "zone_id": "use1-az9"})
    with pytest.raises(UnknownPlace, match="use1-az9 is not a zone of us-east-1"):
        launcher.launch(request(9, unknown))
    not_in_catalog = Placement(**{**by_id.__dict__, "zone_id": None, "zone": "us-east-1z"})
    with pytest.raises(UnknownPlace, match="SkyPilot does not know the place .*Invalid zone 'us-east-1z'"):
        launcher.launch(request(9, not_in_catalog))
    # an instance type SkyPilot's catalog lacks there (its catalog and the broker's prices are of
    # different dates): the next place too, not the job failed as "SkyPilot refused the launch"
    not_there = Placement(**{**by_id.__dict__, "instance_type": "g4dn.3xlarge"})
    with pytest.raises(UnknownPlace, match=r"\(g4dn.3xlarge\): .*instance type"):
        launcher.launch(request(9, not_there))
    assert issubclass(UnknownPlace, CapacityError) and not sky_aws.instances()


def test_a_launch_while_the_local_api_server_is_down_waits_for_it_and_one_it_forgot_is_sent_again(
        sky_aws: SkyAws, launcher) -> None:
    # The re-attach's api_status neither starts nor waits for a local server:
    # the launch is put off (never failed), and the janitor's probe starts it.
    # A restart forgets the requests in flight: such a launch is followed until
    # the server answers without it, then reported lost (never waited out for
    # the launch timeout, never a refusal), to be sent again.
    import sky

    from spotbroker.broker.launch.skypilot.janitor import check

    flying = launcher.launch(request(12, placement("us-east-1c")))
    wait_for(sky_aws.instances, 90, "the instance in moto")
    assert launcher.status(flying).state == RunState.PENDING
    sky.api_stop()
    with pytest.raises(LauncherUnavailable, match="SkyPilot's API server does not answer"):
        launcher.launch(request(10, placement("us-east-1b")))
    assert launcher.readiness()[0] is False
    assert launcher.server.wanted.is_set(), "the janitor is asked to probe now"
    # What the janitor's thread does next: starts the server, runs sky check; and, as its thread
    # does, again at its next tick if that start failed (on a loaded machine the server started
    # right after the stop once exited at once: "SkyPilot API server process exited unexpectedly").
    deadline = time.monotonic() + 120
    while not check(launcher) and time.monotonic() < deadline:
        time.sleep(2)
    assert launcher.readiness() == (True, "SkyPilot can launch on aws")
    lost = wait_for(lambda: (s := launcher.status(flying)).state != RunState.PENDING and s, 60, "the loss seen")
    assert lost.resend and not lost.capacity and flying["request_id"] in lost.error, lost
    again = launcher.launch(request(12, placement("us-east-1c")))
    assert again["cluster"] == flying["cluster"] and again["request_id"] != flying["request_id"]
    handle = launcher.launch(request(10, placement("us-east-1b")))
    wait_for(lambda: len(sky_aws.instances()) == 2, 90, "the second instance in moto")
    time.sleep(3)
    zones = sorted(i["Placement"]["AvailabilityZone"] for i in sky_aws.instances())
    assert zones == ["us-east-1b", "us-east-1c"], f"each launch one node, at its place: {zones}"
    assert launcher.status(again).state == RunState.PENDING
    launcher.terminate(handle)
    launcher.terminate(again)
    wait_for(lambda: not sky_aws.instances(), 90, "no instance left")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_preflight_launches_the_chosen_cpu_type_before_any_gpu(sky_aws: SkyAws, launcher, factory,
                                                                 settings) -> None:
    """Issue #26: a GPU job with `preflight` is first placed, by the
    reconciler, on the cheapest priced CPU place, and SkyPilot launches an
    instance of that CPU type there, told it is a pre-flight with no GPU."""
    from datetime import UTC, datetime

    from sqlalchemy import select
    from support.helpers import submit
    from support.skyenv import ZONES

    from spotbroker.broker import auth
    from spotbroker.broker.launch.request import launch_request
    from spotbroker.broker.pricing.catalog import OfferRow
    from spotbroker.broker.pricing.offers import record_samples
    from spotbroker.broker.reconciler import Reconciler
    from spotbroker.broker.store.db import transaction
    from spotbroker.broker.store.models import Attempt

    cpu = {"us-east-1a": 0.081, "us-east-1b": 0.0652, "us-east-1c": 0.077}  # us-east-1b is the cheapest
    rows = [OfferRow(cloud="aws", region="us-east-1", zone=zone, zone_id=zone_id, instance_type=itype,
                     accelerator=gpu, accelerator_count=float(bool(gpu)), vcpus=vcpus, memory_gib=mem,
                     spot_price=spot, ondemand_price=od)
            for zone, zone_id in ZONES.items()
            for itype, gpu, vcpus, mem, spot, od in (("m6i.2xlarge", None, 8.0, 32.0, cpu[zone], 0.384),
                                                     ("g4dn.xlarge", "T4", 4.0, 16.0, 0.2, 0.526))]
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with transaction(factory) as s:
        record_samples(s, rows, "aws", datetime.now(UTC))
        team, _ = auth.create_team(s, "ml")
    job_id = submit(factory, team.id, run="python train.py", preflight=True,
                    resources={"accelerators": "T4:1", "infra": "aws/us-east-1"})
    Reconciler(factory, {"skypilot": launcher}, settings).pass_once()
    with factory() as s:
        (attempt,) = s.scalars(select(Attempt).where(Attempt.job_id == job_id))
        req = launch_request(s, attempt, settings, settings.signing_key())
        handle = attempt.handle
    assert attempt.preflight and attempt.launcher == "skypilot" and handle is not None
    assert (attempt.instance_type, attempt.zone, attempt.accelerator, attempt.use_spot) == \
        ("m6i.2xlarge", "us-east-1b", None, True)
    assert req.extra_env["SPOTBROKER_PREFLIGHT"] == "1" and req.extra_env["CUDA_VISIBLE_DEVICES"] == ""
    task = launcher.task(req)
    (resources,) = task.resources
    assert (resources.instance_type, resources.zone, resources.accelerators) == ("m6i.2xlarge", "us-east-1b", None)
    assert task.envs["SPOTBROKER_PREFLIGHT"] == "1" and task.envs["CUDA_VISIBLE_DEVICES"] == "" and task.num_nodes == 1
    try:
        (instance,) = wait_for(sky_aws.instances, 90, "the pre-flight's instance in moto")
        assert instance["InstanceType"] == "m6i.2xlarge"
        assert instance["Placement"]["AvailabilityZone"] == "us-east-1b"
        assert instance.get("InstanceLifecycle") == "spot"
    finally:
        launcher.terminate(handle)
        wait_for(lambda: not sky_aws.instances(), 90, "no instance left")
