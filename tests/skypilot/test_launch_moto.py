"""The SkyPilot launcher through real SkyPilot (its API server, its AWS
provisioner) against moto's EC2 in this process (see skyenv.py).

moto starts no machine: SkyPilot's launch would wait 600 s (hard-coded) for
SSH. These tests stop at what SkyPilot does before SSH (the EC2 instance
with the pinned type, zone and market), and use the launcher's bound to
cancel the launch; what the node runs after SSH is test_node_program.py's.
"""
from __future__ import annotations

import threading
import time

import pytest

from skypilot.skyenv import SkyAws, sky_aws  # noqa: F401  (the fixture)
from spotbroker.broker.launch.base import LaunchRequest, RunState
from spotbroker.broker.offers import Placement

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
    launcher = SkyPilotLauncher(wheels, prefix=f"sbt{int(time.time()) % 100000}", launch_timeout_s=60,
                                poll_s=0.2, cluster_poll_s=1.0)
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


def test_a_launch_creates_the_pinned_instance_and_down_removes_it(sky_aws: SkyAws, launcher) -> None:
    started = time.monotonic()
    handle = launcher.launch(request(2, placement("us-east-1c")))
    assert time.monotonic() - started < 5, "launch waits for nothing but the request"
    assert launcher.status(handle).state == RunState.PENDING
    (instance,) = wait_for(sky_aws.instances, 90, "the instance in moto")
    assert instance["InstanceType"] == "g4dn.xlarge"
    assert instance["Placement"]["AvailabilityZone"] == "us-east-1c"
    assert instance.get("InstanceLifecycle") == "spot"
    launcher.terminate(handle)
    wait_for(lambda: not sky_aws.instances(), 90, "no instance left")
