"""Real SkyPilot against moto's EC2: the environment the SkyPilot tests share.

tests/skypilot/conftest.py imports the fixtures by name (`sky_aws` for a
module, `sky_world` under it, one per worker).

What it sets up (the recipe of ../shared/FIELD-NOTES.md, checked with
skypilot 0.14.1 and moto 5.2.5):

- moto's server in this process (`ThreadedMotoServer`), so a test can make
  its EC2 backend refuse capacity (`refuse_capacity`), with IAM's managed
  policies loaded;
- a temporary HOME and SKY_RUNTIME_DIR, SkyPilot's own API server on a free
  port (it copies this process's environment when the first SDK call starts
  it), fake AWS credentials and `AWS_ENDPOINT_URL` pointing at moto;
- hand-placed catalog files (never refetched: no `.meta`), whose images map
  to one of moto's AMIs;
- an instance profile named as SkyPilot's `remote_identity` (SkyPilot's own
  role policy has no `Version`, which moto refuses), and an internet
  gateway with a default route in the default VPC (else SkyPilot finds only
  private subnets);
- SkyPilot's config allowing AWS only.

The environment is in os.environ only while a module that uses it runs.
The rest outlives the module, for the next one on the worker: the last
(in the run's order) undoes it all: `sky api stop`, moto stopped, the
directory removed.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

from support.ports import free_port

REGION = "us-east-1"
AMI = "ami-785db401"  # one of moto's own images
PROFILE = "spotbroker-node"
# moto's us-east-1: us-east-1a is use1-az6, us-east-1b is use1-az1, us-east-1c is use1-az2.
ZONES = {"us-east-1a": "use1-az6", "us-east-1b": "use1-az1", "us-east-1c": "use1-az2"}
GPU_INFO = ("\"{'Gpus': [{'Name': 'T4', 'Manufacturer': 'NVIDIA', 'Count': 1, 'MemoryInfo': "
            "{'SizeInMiB': 16384}}], 'TotalGpuMemoryInMiB': 16384}\"")
VMS_HEADER = ("InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,"
              "AvailabilityZone,Arch,LocalDiskType,NVMeSupported,LocalDiskSize,LocalDiskCount,MaximumEfaInterfaces")


def _catalog_rows() -> list[str]:
    rows = []
    for zone_id in ZONES.values():
        rows.append(f"g4dn.xlarge,T4,1.0,4.0,16.0,{GPU_INFO},0.526,0.2,{REGION},{zone_id},x86_64,ssd,True,125,1,0")
        rows.append(f"m6i.large,,,2.0,8.0,,0.096,0.04,{REGION},{zone_id},x86_64,,,,,0")
        rows.append(f"m6i.2xlarge,,,8.0,32.0,,0.384,0.16,{REGION},{zone_id},x86_64,,,,,0")  # SkyPilot's default CPU
    return rows


def place_catalog(root: Path) -> None:
    """SkyPilot's AWS catalog for the test's shapes, placed by hand."""
    aws = root / ".sky" / "catalogs" / "v8" / "aws"
    common = aws.parent / "common"
    aws.mkdir(parents=True)
    common.mkdir()
    (aws / "vms.csv").write_text("\n".join([VMS_HEADER, *_catalog_rows()]) + "\n")
    tags = ["skypilot:custom-cpu-ubuntu", "skypilot:custom-gpu-ubuntu", "skypilot:custom-gpu-ubuntu-cuda13"]
    (aws / "images.csv").write_text("Tag,Region,OS,OSVersion,ImageId,CreationDate\n" + "".join(
        f"{tag},{REGION},ubuntu,22.04,{AMI},20240101\n" for tag in tags))
    (aws / "instance_quota_mapping.csv").write_text(
        "InstanceType,OnDemandInstanceCode,SpotInstanceCode\n"
        "g4dn.xlarge,L-DB2E81BA,L-3819A6DF\nm6i.large,L-1216C47A,L-34B43A08\nm6i.2xlarge,L-1216C47A,L-34B43A08\n")
    (common / "accelerators.csv").write_text("AcceleratorName,Clouds\nT4,\"['AWS', 'GCP']\"\n")


@dataclass
class SkyAws:
    """The running environment: moto's endpoint and a way to look into it."""

    endpoint: str
    home: Path
    server: object  # moto's ThreadedMotoServer

    def ec2(self):
        return boto3.client("ec2", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def instances(self, states: tuple[str, ...] = ("pending", "running")) -> list[dict]:
        """Instances in moto that are pending or running (what bills)."""
        found = []
        for page in self.ec2().describe_instances()["Reservations"]:
            found += [i for i in page["Instances"] if i["State"]["Name"] in states]
        return found


def _zone_of(backend, kwargs: dict) -> str:
    """The zone a RunInstances call asks for: named, or its subnet's (SkyPilot names a subnet)."""
    if kwargs.get("placement"):
        return kwargs["placement"]
    nics = kwargs.get("nics") or []
    subnet = kwargs.get("subnet_id") or next((n.get("SubnetId") for n in nics if isinstance(n, dict)), None)
    return backend.get_subnet(subnet).availability_zone if subnet else ""


@contextmanager
def refuse_capacity(*zones: str) -> Iterator[None]:
    """moto's EC2 answers RunInstances in `zones` as AWS does when a zone has
    no room (InsufficientInstanceCapacity)."""
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models.instances import InstanceBackend

    original = InstanceBackend.run_instances

    def run_instances(self, image_id, count, user_data, security_group_names, **kwargs):
        zone = _zone_of(self, kwargs)
        if zone in zones:
            raise EC2ClientError("InsufficientInstanceCapacity",
                                 f"We currently do not have sufficient capacity in the Availability Zone ({zone}).")
        return original(self, image_id, count, user_data, security_group_names, **kwargs)

    InstanceBackend.run_instances = run_instances
    try:
        yield
    finally:
        InstanceBackend.run_instances = original


def _prepare_aws(endpoint: str) -> None:
    iam = boto3.client("iam", endpoint_url=endpoint, region_name=REGION,
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    trust = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
    # moto's backends are the process's: a second module in this process (one
    # test worker) finds what the first one made, so each step is idempotent.
    # Each step on its own: another module may have left the role without the profile.
    if PROFILE not in {r["RoleName"] for r in iam.list_roles()["Roles"]}:
        iam.create_role(RoleName=PROFILE, AssumeRolePolicyDocument=json.dumps(trust))
    profiles = {p["InstanceProfileName"]: p for p in iam.list_instance_profiles()["InstanceProfiles"]}
    if PROFILE not in profiles:
        iam.create_instance_profile(InstanceProfileName=PROFILE)
    if not any(r["RoleName"] == PROFILE for r in profiles.get(PROFILE, {}).get("Roles", [])):
        iam.add_role_to_instance_profile(InstanceProfileName=PROFILE, RoleName=PROFILE)
    ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name=REGION,
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    if ec2.describe_internet_gateways(Filters=[{"Name": "attachment.vpc-id", "Values": [vpc]}])["InternetGateways"]:
        return
    gateway = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=gateway, VpcId=vpc)
    table = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["RouteTables"][0]
    ec2.create_route(RouteTableId=table["RouteTableId"], DestinationCidrBlock="0.0.0.0/0", GatewayId=gateway)


def _environment(home: Path, endpoint: str, api_port: str) -> dict[str, str]:
    return {
        "HOME": str(home), "SKY_RUNTIME_DIR": str(home),
        "SKYPILOT_API_SERVER_LOCAL_PORT": api_port,
        "SKYPILOT_DISABLE_USAGE_COLLECTION": "1", "SKYPILOT_DEBUG": "0",
        "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION,
        "MOTO_IAM_LOAD_MANAGED_POLICIES": "true",
    }


# What entering the environment sets or removes (and leaving puts back).
_SAVED = (*_environment(Path(), "", ""), "SKYPILOT_API_SERVER_ENDPOINT", "AWS_PROFILE", "AWS_SESSION_TOKEN")


def _point_sky_at(home: Path) -> str | None:
    """If SkyPilot was imported before (by another test in this process: the
    API parses task files with it), what it read from the HOME of then is
    fixed: its catalog directory, the AWS catalog's tables, its config and
    the API server's URL (cached). Point them all at ours."""
    common = sys.modules.get("sky.catalog.common")
    if common is None:
        return None
    before = common._ABSOLUTE_VERSIONED_CATALOG_DIR
    _reload_sky(str(home / ".sky" / "catalogs" / "v8"))
    return before


def _reload_sky(catalog_dir: str) -> None:
    import importlib

    sys.modules["sky.catalog.common"]._ABSOLUTE_VERSIONED_CATALOG_DIR = catalog_dir
    # Each module that read a catalog file at its import holds that file's
    # path: the accelerators' table too, else it names an earlier test's
    # directory, gone, and SkyPilot fetches the file from the network.
    for name in ("sky.catalog.aws_catalog", "sky.utils.accelerator_registry"):
        if name in sys.modules:
            importlib.reload(sys.modules[name])
    if "sky.server.common" in sys.modules:
        sys.modules["sky.server.common"].get_server_url.cache_clear()
    if "sky.skypilot_config" in sys.modules:
        sys.modules["sky.skypilot_config"].reload_config()
    if "sky.utils.annotations" in sys.modules:
        # What SkyPilot cached per request: the AWS identity above all (moto's,
        # inside; none, outside), which decides whether the AWS catalog asks
        # AWS for its zones when it is next read.
        sys.modules["sky.utils.annotations"].clear_request_level_cache()


class SkyWorld:
    """moto, a HOME and SkyPilot's API server, made once and entered by each
    test module that uses them. Entering puts the environment in os.environ
    (and points an already imported SkyPilot at it); leaving restores both,
    so the tests of other modules see nothing of it between. The API server
    (started by the first SDK call, with the environment of then) outlives
    each module: a start is about 30 s of CPU, its executor processes each
    importing SkyPilot. `close` stops it, moto, and removes the HOME."""

    def __init__(self) -> None:
        self.aws: SkyAws | None = None
        self._env: dict[str, str] = {}

    def _make(self) -> SkyAws:
        from moto.server import ThreadedMotoServer

        home = Path(tempfile.mkdtemp(prefix="sky-home-"))
        os.environ["MOTO_IAM_LOAD_MANAGED_POLICIES"] = "true"  # read by moto as it loads IAM
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        place_catalog(home)
        # `sky check` of every cloud SkyPilot knows (azure-cli's import above all) takes
        # a minute on a loaded machine: only AWS is here, as an operator would say it.
        (home / ".sky" / "config.yaml").write_text(f"aws:\n  remote_identity: {PROFILE}\nallowed_clouds: [aws]\n")
        self._env = _environment(home, endpoint, str(free_port()))
        _prepare_aws(endpoint)
        return SkyAws(endpoint=endpoint, home=home, server=server)

    @contextmanager
    def entered(self) -> Iterator[SkyAws]:
        saved = {name: os.environ.get(name) for name in _SAVED}
        try:
            if self.aws is None:
                self.aws = self._make()
            for name in ("SKYPILOT_API_SERVER_ENDPOINT", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
                os.environ.pop(name, None)
            os.environ.update(self._env)
            catalog_before = _point_sky_at(self.aws.home)
            try:
                yield self.aws
            finally:
                if catalog_before is not None:
                    _reload_sky(catalog_before)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def close(self) -> None:
        if self.aws is None:
            return
        try:
            with self.entered():
                import sky

                sky.api_stop()
        finally:
            self.aws.server.stop()
            shutil.rmtree(self.aws.home, ignore_errors=True)
            self.aws = None


@pytest.fixture(scope="session")
def sky_world() -> Iterator[SkyWorld]:
    world = SkyWorld()
    yield world
    world.close()


@pytest.fixture(scope="module")
def sky_aws(sky_world: SkyWorld, request: pytest.FixtureRequest) -> Iterator[SkyAws]:
    """The world of the worker, entered for the module. The suite's scheduler gives
    the modules that use it to one worker (SKY_SERVER_FILES, tests/conftest.py),
    and the last of them in the run's order stops it."""
    with sky_world.entered() as aws:
        yield aws
    using = [item.module.__file__ for item in request.session.items if "sky_aws" in item.fixturenames]
    if using and using[-1] == request.module.__file__:  # no module after this one needs it
        sky_world.close()


@contextmanager
def sky_environment() -> Iterator[SkyAws]:
    """What `sky_aws` gives a test module, for a script (bench/stack_failover.py)."""
    world = SkyWorld()
    try:
        with world.entered() as aws:
            yield aws
    finally:
        world.close()
