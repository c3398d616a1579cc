"""The Task the SkyPilot launcher would launch for a job's file: the file as
SkyPilot reads it (`task_from_spec`), with the node program's setup, run,
envs, secrets and file mounts, pinned to the chosen place while keeping the
chosen resource set's disk, image, cpus and memory. Real SkyPilot, offline
(the broker's bundled catalog rows); nothing is launched.

And the local launcher: a job's process sees its own secrets in its
environment, and the broker logs none of them."""
from __future__ import annotations

import json
import logging

import pytest
import yaml
from sqlalchemy import select
from support.helpers import run_to_end

from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.launch.base import LaunchError, LaunchRequest
from spotbroker.broker.pricing.offers import Placement
from spotbroker.broker.usecases import taskyaml

sky = pytest.importorskip("sky", reason="SkyPilot (the broker extra) is not installed")

SECRET = "hf-s3cr3t-value-1234"
FILE = f"""
name: finetune
resources:
  use_spot: true
  infra: aws/us-east-1
  any_of:
    - accelerators: {{T4: 1}}
      disk_size: 256
      cpus: 4+
      memory: 16+
      image_id: ami-0123456789abcdef0
    - accelerators: A10G:1
      disk_size: 512
      image_id: {{us-east-1: ami-0fedcba9876543210, us-west-2: ami-0aaaaaaaaaaaaaaaa}}
envs: {{EPOCHS: "3"}}
secrets: {{HF_TOKEN: {SECRET}}}
file_mounts:
  /data: s3://team-bucket/ml/data
setup: pip list
run: python train.py --epochs $EPOCHS
"""


def stored_spec() -> JobSpec:
    """As the API stores it and the reconciler reads it back."""
    spec = JobSpec.model_validate(taskyaml.to_spec(yaml.safe_load(FILE)))
    return JobSpec.model_validate(json.loads(json.dumps(spec.stored())))


def placement(accelerator: str, instance_type: str, zone: str = "us-east-1b") -> Placement:
    return Placement(cloud="aws", region="us-east-1", zone=zone, zone_id=None, instance_type=instance_type,
                     accelerator=accelerator, accelerator_count=1, use_spot=True, price_per_hour=0.2)


def request(spec: JobSpec, where: Placement) -> LaunchRequest:
    """What `launch.request.launch_request` makes of an attempt of the job."""
    return LaunchRequest(attempt_id=41, job_id=4, team="ml", run=spec.run, setup=spec.setup, envs=spec.envs,
                         num_nodes=spec.num_nodes, placement=where,
                         extra_env={"SPOTBROKER_AGENT_TOKEN": "agent-token", "SPOTBROKER_ATTEMPT_ID": "41"},
                         secrets=spec.secret_values(), spec=spec)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    from spotbroker.broker.launch.skypilot.launcher import SkyPilotLauncher

    wheels = tmp_path_factory.mktemp("wheels")
    (wheels / "spotbroker-0.1.0-py3-none-any.whl").write_bytes(b"")
    launcher = SkyPilotLauncher(wheels, prefix="sbtask")
    yield launcher
    launcher.close()


def test_buckets_by_name_are_the_teams_and_uploads_the_node_programs(launcher, tmp_path):
    """A bucket by name is SkyPilot's storage mount of its home in the team's
    storage (never a bucket SkyPilot would create); an unlisted mount is not
    mounted; uploads are placed by the node program before setup."""
    from dataclasses import replace

    from spotbroker.broker.jobs import mounts
    from spotbroker.broker.jobs.buckets import Allowed
    from spotbroker.broker.settings import Settings

    spec = JobSpec.model_validate({"run": "x", "resources": {"accelerators": "T4:1"}, "file_mounts": {
        "/ckpt": {"name": "my-ckpts", "mode": "MOUNT"}, "/data": "s3://datasets/imagenet",
        "/gone": {"source": "s3://no-longer-listed/x", "mode": "COPY"},
        "~/cfg": {"upload": "c" * 64}, "~/.ssh/key": {"upload": "d" * 64, "file": True}}})
    settings = Settings(data_dir=tmp_path, checkpoint_root="s3://ckpt/root", _env_file=None)
    resolved = tuple(mounts.resolved(settings, "ml", spec, [Allowed("s3://datasets/", True)]))
    task = launcher.task(replace(request(spec, placement("T4", "g4dn.xlarge")), mounts=resolved))
    assert {k: v.source for k, v in task.storage_mounts.items()} == {"/ckpt": "s3://ckpt/root/ml/buckets/my-ckpts/"}
    assert task.file_mounts == {"/data": "s3://datasets/imagenet", "~/.spotbroker/wheels": str(launcher.wheelhouse)}
    placed = json.loads(task.envs["SPOTBROKER_MOUNTS"])
    assert {m["path"]: m["kind"] for m in placed} == {"/ckpt": "bucket", "/data": "bucket", "~/cfg": "dir",
                                                     "~/.ssh/key": "file"}
    assert task.setup.index("pip install") < task.setup.index("spotbroker.agent.mounts")  # with the wheel installed
    assert "--no-cloud-buckets" in task.setup


def test_the_task_is_the_files_on_the_chosen_place_field_by_field(launcher):
    spec = stored_spec()
    task = launcher.task(request(spec, placement("T4", "g4dn.xlarge")))

    assert (task.name, task.num_nodes) == ("finetune", 1)
    assert "pip list" in task.setup and "--no-index" in task.setup
    assert "python -I -m spotbroker.agent.cli run" in task.run and "python train.py --epochs $EPOCHS" in task.run
    assert task.envs["EPOCHS"] == "3" and task.envs["SPOTBROKER_ATTEMPT_ID"] == "41"
    assert {k: v.get_secret_value() for k, v in task.secrets.items()} == {
        "HF_TOKEN": SECRET, "SPOTBROKER_AGENT_TOKEN": "agent-token"}
    assert SECRET not in json.dumps(task.envs) and "agent-token" not in json.dumps(task.envs)
    assert task.file_mounts == {"/data": "s3://team-bucket/ml/data", "~/.spotbroker/wheels": str(launcher.wheelhouse)}

    (r,) = task.resources
    assert (str(r.cloud), r.region, r.zone, r.instance_type, r.accelerators, r.use_spot) == (
        "AWS", "us-east-1", "us-east-1b", "g4dn.xlarge", {"T4": 1}, True)
    # the chosen resource set's own asks, kept on the pinned resources
    assert (r.disk_size, r.cpus, r.memory) == (256, "4+", "16+")
    assert r.image_id == {"us-east-1": "ami-0123456789abcdef0"}  # SkyPilot keys it by the pinned region
    # (`task.validate()` maps zone names to zone ids through the AWS account:
    # test_launch_moto.py validates and dry-runs the launcher's Task there)


def test_the_other_alternative_keeps_its_own_disk_and_its_regions_image(launcher):
    task = launcher.task(request(stored_spec(), placement("A10G", "g5.xlarge", zone="us-east-1a")))
    (r,) = task.resources
    assert (r.instance_type, r.zone, r.accelerators) == ("g5.xlarge", "us-east-1a", {"A10G": 1})
    assert r.disk_size == 512 and r.image_id == {"us-east-1": "ami-0fedcba9876543210"}
    # the instance type's own figures: the T4 set's `4+`/`16+` are not carried over
    assert (str(r.cpus), str(r.memory)) == ("4.0", "16.0")


def test_a_place_that_fits_no_resource_set_is_refused_not_launched_bare(launcher):
    with pytest.raises(LaunchError, match="fits none of the job's resource sets"):
        launcher.task(request(stored_spec(), placement("L4", "g6.xlarge")))


K8S_FILE = """
name: finetune-k8s-first
resources:
  any_of:
    - infra: k8s/lab-a
      accelerators: H100:8
      cpus: 32+
      image_id: docker:nvcr.io/nvidia/pytorch:24.08-py3
    - accelerators: H100:8
      use_spot: true
run: python finetune.py
"""


def test_a_kubernetes_place_pins_its_context_and_gpus_as_skypilot_reads_k8s_infra(launcher):
    """The Task for one of the operator's clusters: `infra: k8s/CONTEXT` with
    the accelerators, never spot, the resource set's cpus and image kept;
    equal to what SkyPilot parses from that alternative. (SkyPilot's
    `Task.validate()` on Kubernetes resources needs `skypilot[kubernetes]`
    and a dry run an enabled cluster: past SkyPilot's boundary here.)"""
    spec = JobSpec.model_validate(json.loads(json.dumps(
        JobSpec.model_validate(taskyaml.to_spec(yaml.safe_load(K8S_FILE))).stored())))
    where = Placement(cloud="k8s", region="lab-a", zone=None, zone_id=None, instance_type=None, accelerator="H100",
                      accelerator_count=8, use_spot=False, price_per_hour=0.0)
    (ours,) = launcher.task(request(spec, where)).resources
    theirs = sky.Task.from_yaml_config({"run": "x", "resources": yaml.safe_load(K8S_FILE)["resources"]["any_of"][0]})
    (theirs,) = theirs.resources
    fields = ("cloud", "region", "zone", "instance_type", "accelerators", "use_spot", "cpus", "memory", "image_id")
    assert {f: str(getattr(ours, f)) for f in fields} == {f: str(getattr(theirs, f)) for f in fields}
    assert (str(ours.cloud), ours.region, ours.accelerators, ours.use_spot) == ("Kubernetes", "lab-a", {"H100": 8},
                                                                                 False)
    # the spot alternative on a cloud is still spot there
    cloud = Placement(cloud="aws", region="us-east-1", zone="us-east-1a", zone_id=None, instance_type="p5.48xlarge",
                      accelerator="H100", accelerator_count=8, use_spot=True, price_per_hour=10.0)
    (r,) = launcher.task(request(spec, cloud)).resources
    assert (str(r.cloud), r.instance_type, r.use_spot, r.image_id) == ("AWS", "p5.48xlarge", True, None)


def test_the_request_shows_no_secret(launcher):
    req = request(stored_spec(), placement("T4", "g4dn.xlarge"))
    assert SECRET not in repr(req) and "HF_TOKEN" not in repr(req)


def test_a_local_job_sees_its_secret_in_its_env_and_no_log_shows_it(factory, settings, agent_endpoint, tmp_path,
                                                                    caplog):
    from spotbroker.broker import auth
    from spotbroker.broker.store import sealing
    from spotbroker.broker.store.db import transaction
    from spotbroker.broker.store.models import Event, Job
    from spotbroker.broker.usecases import jobs

    caplog.set_level(logging.DEBUG)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "seen"
    with transaction(factory) as s:
        team, _ = auth.create_team(s, "ml")
        job_id = jobs.submit(s, team.id, JobSpec.model_validate(
            {"run": f'printf %s "$HF_TOKEN" > {out}', "secrets": {"HF_TOKEN": SECRET}}),
            keyring=sealing.keyring(settings)).id
    run_to_end(factory, settings, job_id, timeout=30)
    with factory() as s:
        assert s.get(Job, job_id).state == "SUCCEEDED"
        events = [json.dumps(e.data, default=str) for e in s.scalars(select(Event))]
    assert out.read_text() == SECRET
    assert SECRET not in caplog.text
    assert not any(SECRET in e for e in events)


def test_a_nodes_agent_bounds_the_job_output_as_the_broker_does(tmp_path):
    """The broker keeps at most SPOTBROKER_MAX_LOG_BYTES of a job's log; the
    agent on a SkyPilot node is told the same bound, so it neither fills
    the node's disk nor ships what the broker would drop."""
    from spotbroker.broker.launch.skypilot.launcher import SkyPilotLauncher
    from spotbroker.broker.settings import Settings

    settings = Settings(database_url="sqlite://", admin_token="a", secret_key="k", data_dir=tmp_path,
                        max_log_bytes=12345, _env_file=None)
    launcher = SkyPilotLauncher.from_settings(settings)
    try:
        task = launcher.task(request(stored_spec(), placement("T4", "g4dn.xlarge")))
    finally:
        launcher.close()
    assert "spotbroker.agent.cli run --max-log-bytes 12345 " in task.run
