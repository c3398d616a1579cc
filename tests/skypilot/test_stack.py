"""The whole stack, as processes (docker-compose.yml's topology; there is no
Docker engine here): PostgreSQL, two broker replicas (`spotbroker serve`,
SPOTBROKER_LAUNCHER=skypilot), one SkyPilot API server process both share,
and moto serving S3, STS, IAM and EC2, with SPOTBROKER_NODE_ROLE_ARN set
and an s3:// checkpoint root.

A GPU job placed on AWS launches a spot instance in moto through SkyPilot.
The replica stepping the job is killed with SIGKILL as it launches; the
other one takes the job's next step once the lease runs out (re-attaching
to the launch, or sending it: one instance either way), follows it,
cancels it on request and leaves no instance. The time from the kill to
that step is printed (docs/benchmarks.md).

moto starts no machine (no SSH, no agent): the agent's part is played by
the test over the agent API, with the attempt's own token.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import httpx
import pytest
from helpers import create_pg_database, drop_pg_database
from skypilot.skyenv import REGION, SkyAws
from sqlalchemy import select

from spotbroker.broker import auth
from spotbroker.broker.recovery.agent_channel import agent_token
from spotbroker.broker.settings import Settings
from spotbroker.broker.store import migrate
from spotbroker.broker.store.db import make_engine, make_session_factory, transaction
from spotbroker.broker.store.models import Attempt, Job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(280)]

SECRET = "stack-signing-key"
BUCKET = "stack-checkpoints"
LEASE_S, PASS_S = 5.0, 0.5
# Logs shipped to one replica, read through the other: the log store moves
# into the database with the `logs` branch; until it is merged a replica
# reads only what was shipped to itself. Set True once it is.
LOGS_ACROSS_REPLICAS = False


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replica:
    def __init__(self, name: str, env: dict[str, str], root: Path) -> None:
        self.name, self.port, self.proc = name, _free_port(), None
        self.log = root / f"{name}.log"
        self.env = {**env, "SPOTBROKER_DATA_DIR": str(root / name), "SPOTBROKER_PORT": str(self.port)}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "spotbroker.broker.cli", "serve", "--port",
                                          str(self.port), "--log-level", "warning"], env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT)

    def ready(self) -> dict | None:
        """/readyz's body once the replica serves and its launcher can launch."""
        try:
            r = httpx.get(f"{self.url}/readyz", timeout=2)
        except httpx.TransportError:
            return None
        body = r.json() if r.status_code == 200 else None
        return body if body and (body.get("launch") or {}).get("ready") else None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_for(predicate, timeout: float, what: str, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def _aws(service: str, endpoint: str):
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing",
                        aws_secret_access_key="testing")


def _node_role(endpoint: str) -> str:
    """The role nodes' S3 credentials are minted from, and the checkpoint bucket, in moto."""
    import json

    _aws("s3", endpoint).create_bucket(Bucket=BUCKET)
    trust = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}]}
    return _aws("iam", endpoint).create_role(RoleName="stack-node", AssumeRolePolicyDocument=json.dumps(trust))[
        "Role"]["Arn"]


@pytest.fixture
def database(pg_server):
    url = create_pg_database("spotbroker_stack")
    engine = make_engine(url)
    migrate.upgrade(engine)
    yield url, engine
    engine.dispose()
    drop_pg_database(url)


def test_the_stack_launches_fails_over_between_replicas_and_cancels(sky_aws: SkyAws, database, tmp_path) -> None:
    import sky

    url, engine = database
    factory = make_session_factory(engine)
    with transaction(factory) as s:
        _, token = auth.create_team(s, "ml")
    headers = {"Authorization": f"Bearer {token}"}
    role = _node_role(sky_aws.endpoint)
    sky.api_start()  # the one SkyPilot API server, its own process, shared by both replicas
    api_port = os.environ["SKYPILOT_API_SERVER_LOCAL_PORT"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    env.update(SPOTBROKER_DATABASE_URL=url, SPOTBROKER_LAUNCHER="skypilot", SPOTBROKER_SECRET_KEY=SECRET,
               SKYPILOT_API_SERVER_ENDPOINT=f"http://127.0.0.1:{api_port}",
               SPOTBROKER_NODE_ROLE_ARN=role, SPOTBROKER_CHECKPOINT_ROOT=f"s3://{BUCKET}/ckpt",
               SPOTBROKER_LEASE_SECONDS=str(LEASE_S), SPOTBROKER_RECONCILE_INTERVAL=str(PASS_S),
               SPOTBROKER_SKYPILOT_CLUSTER_PREFIX=f"stack{int(time.time()) % 100000}",
               SPOTBROKER_SKYPILOT_JANITOR_INTERVAL="30", SPOTBROKER_LOCAL_LAUNCHER="false")
    replicas = [Replica(name, env, tmp_path) for name in ("a", "b")]
    _one_wheelhouse(tmp_path, replicas)
    started, passed = time.monotonic(), False
    try:
        for r in replicas:
            r.start()
        for r in replicas:
            body = wait_for(r.ready, 150, f"replica {r.name} ready to launch (see {r.log})", every=1.0)
            assert body["launch"] == {"launcher": "skypilot", "ready": True, "detail": "SkyPilot can launch on aws"}
        print(f"STACK replicas ready to launch in {time.monotonic() - started:.1f} s")
        _run(sky_aws, factory, replicas, headers)
        passed = True
    finally:
        for r in replicas:
            r.stop()
        for r in replicas if not passed else ():
            print(f"--- {r.name}'s log (tail)\n{r.log.read_text()[-3000:] if r.log.exists() else ''}")


def _one_wheelhouse(root: Path, replicas: list[Replica]) -> None:
    """The nodes' wheelhouse, built once (each replica would build the same one in its data dir)."""
    import shutil

    from spotbroker.broker.launch.skypilot.wheel import wheelhouse

    built = wheelhouse(root / "wheels")
    for r in replicas:
        shutil.copytree(built.parent, Path(r.env["SPOTBROKER_DATA_DIR"]) / "wheels")


def _run(sky_aws: SkyAws, factory, replicas: list[Replica], headers: dict) -> None:
    by_pid = {r.proc.pid: r for r in replicas}
    body = {"name": "stack", "run": "python train.py",
            "resources": {"accelerators": "T4:1", "infra": f"aws/{REGION}", "use_spot": True}}
    r = httpx.post(f"{replicas[0].url}/v1/jobs", json=body, headers=headers, timeout=30)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]

    # The replica stepping the job, caught while it launches (its lease names its pid).
    def launching() -> tuple[Replica, int, bool] | None:
        with factory() as s:
            job = s.get(Job, job_id)
            attempt = s.scalars(select(Attempt).where(Attempt.job_id == job_id)).first()
            assert job.state not in ("FAILED", "HELD"), (job.state, job.reason)
            if attempt is None or job.lease_owner is None:
                return None
            pid = int(job.lease_owner.split(":")[1])
            return by_pid.get(pid), attempt.id, attempt.handle is None
    victim, attempt_id, unlaunched = wait_for(launching, 90, "the launch", every=0.02)
    victim.proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    victim.proc.wait()
    other = next(r for r in replicas if r is not victim)

    # The other replica takes the job's next step once the dead one's lease runs out (its claim names
    # its pid), and stores the handle: re-attached to the launch the dead one sent, or sent now.
    def claimed() -> bool:
        with factory() as s:
            job, attempt = s.get(Job, job_id), s.get(Attempt, attempt_id)
            return attempt.handle is not None or (job.lease_owner or "").split(":")[1:2] == [str(other.proc.pid)]
    wait_for(claimed, 60, "the other replica's step", every=0.05)
    taken_s = time.monotonic() - killed_at
    print(f"STACK replica killed -> job's next step by the other: {taken_s:.2f} s "
          f"(lease {LEASE_S:g} s, pass {PASS_S:g} s, attempt unlaunched at the kill: {unlaunched})")
    if unlaunched:
        assert taken_s <= LEASE_S + PASS_S + 5, taken_s  # (a loaded machine's slack)

    def handled() -> dict | None:
        with factory() as s:
            return s.get(Attempt, attempt_id).handle
    handle = wait_for(handled, 60, "the launch's handle stored")
    (instance,) = wait_for(sky_aws.instances, 90, "the spot instance in moto")
    print(f"STACK spot instance in moto {time.monotonic() - killed_at:.1f} s after the kill")
    with factory() as s:
        attempt = s.get(Attempt, attempt_id)
        zone = attempt.zone or {z["ZoneId"]: z["ZoneName"] for z in
                                sky_aws.ec2().describe_availability_zones()["AvailabilityZones"]}[attempt.zone_id]
        assert (attempt.state, attempt.cloud, attempt.use_spot) == ("LAUNCHING", "aws", True)
    assert instance["Placement"]["AvailabilityZone"] == zone, "launched in the zone the policy chose"
    assert instance.get("InstanceLifecycle") == "spot" and instance["InstanceType"] == attempt.instance_type
    time.sleep(2 * PASS_S)
    assert len(sky_aws.instances()) == 1, "launched once"

    _logs(replicas, victim, other, headers, job_id, attempt_id)

    r = httpx.post(f"{other.url}/v1/jobs/{job_id}/cancel", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    cancelled_at = time.monotonic()
    wait_for(lambda: not sky_aws.instances(), 120, "no instance left after the cancel")
    print(f"STACK no instance {time.monotonic() - cancelled_at:.1f} s after the cancel")
    with factory() as s:
        assert s.get(Job, job_id).state == "CANCELLED"
    import sky

    wait_for(lambda: sky.get(sky.status(cluster_names=[handle["cluster"]])) == [], 90, "the cluster's record gone")


def _logs(replicas, victim: Replica, other: Replica, headers: dict, job_id: int, attempt_id: int) -> None:
    """The agent's lines (the test plays the agent: moto runs no node) read through the replicas."""
    token = agent_token(Settings(secret_key=SECRET, _env_file=None).signing_key(), attempt_id)
    line = b"epoch 1 loss 0.42\n"
    r = httpx.post(f"{other.url}/v1/agent/logs", content=line,
                   headers={"Authorization": f"Bearer {token}", "X-Log-Offset": "0"}, timeout=30)
    assert r.status_code == 200, r.text
    r = httpx.get(f"{other.url}/v1/jobs/{job_id}/logs", headers=headers, timeout=30)
    assert r.status_code == 200 and r.text == line.decode(), r.text
    if LOGS_ACROSS_REPLICAS:  # shipped to one replica, read through another (a third one, here: restarted)
        victim.start()
        wait_for(victim.ready, 120, "the killed replica back")
        r = httpx.get(f"{victim.url}/v1/jobs/{job_id}/logs", headers=headers, timeout=30)
        assert r.status_code == 200 and r.text == line.decode(), r.text
