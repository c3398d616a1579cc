"""The whole stack as processes (docker-compose.yml's topology; there is no
Docker engine here), for test_stack.py and bench/stack_failover.py:
PostgreSQL, broker replicas (`spotbroker serve`, SPOTBROKER_LAUNCHER=
skypilot), one SkyPilot API server process they share, and moto serving
S3, STS, IAM and EC2 (skyenv.py's, in this process), with
SPOTBROKER_NODE_ROLE_ARN set and an s3:// checkpoint root.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import boto3
import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker import auth
from spotbroker.broker.store import migrate
from spotbroker.broker.store.db import make_engine, make_session_factory, transaction
from spotbroker.broker.store.models import Attempt, Job
from support.brokerproc import BrokerProcess
from support.helpers import create_pg_database, drop_pg_database
from support.skyenv import REGION, SkyAws

SECRET = "stack-signing-key"
BUCKET = "stack-checkpoints"
LEASE_S, PASS_S = 5.0, 0.5
GPU_JOB = {"name": "stack", "run": "python train.py",
           "resources": {"accelerators": "T4:1", "infra": f"aws/{REGION}", "use_spot": True}}


def wait_for(predicate, timeout: float, what: str, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def start_api_server() -> None:
    """`sky api start`, which gives up after a fixed 60 s and leaves its
    server process starting; on a loaded machine that server comes up later,
    so wait longer for it to answer."""
    import sky

    try:
        sky.api_start()
    except RuntimeError as exc:
        if "Failed to start SkyPilot API server" not in str(exc):
            raise
        url = f"http://127.0.0.1:{os.environ['SKYPILOT_API_SERVER_LOCAL_PORT']}/api/health"
        wait_for(lambda: _answers(url), 120, f"the SkyPilot API server at {url} (`sky api start` gave up: {exc})")


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


class Replica(BrokerProcess):
    """A broker replica (`serve` with SPOTBROKER_LAUNCHER=skypilot), ready once it can launch."""

    def __init__(self, name: str, env: dict[str, str], root: Path) -> None:
        super().__init__({**env, "SPOTBROKER_DATA_DIR": str(root / name)}, root / f"{name}.log")
        self.name = name
        self.env["SPOTBROKER_PORT"] = str(self.port)
        self.last_ready = "not asked"  # /readyz's last answer, for a timeout's message

    def ready(self) -> dict | None:
        """/readyz's body once the replica serves and its launcher can launch."""
        try:
            r = httpx.get(f"{self.url}/readyz", timeout=2)
        except httpx.TransportError as exc:
            self.last_ready = repr(exc)
            return None
        self.last_ready = f"{r.status_code} {r.text}"
        body = r.json() if r.status_code == 200 else None
        return body if body and (body.get("launch") or {}).get("ready") else None


@dataclass
class Stack:
    sky: SkyAws
    factory: sessionmaker[Session]
    replicas: list[Replica]
    headers: dict[str, str]  # the team's

    def submit(self, replica: Replica, body: dict = GPU_JOB) -> int:
        r = httpx.post(f"{replica.url}/v1/jobs", json=body, headers=self.headers, timeout=30)
        assert r.status_code == 201, r.text
        return r.json()["id"]


def _aws(service: str, endpoint: str):
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing",
                        aws_secret_access_key="testing")


def _node_role(endpoint: str) -> str:
    """The role nodes' S3 credentials are minted from, and the checkpoint bucket, in moto."""
    _aws("s3", endpoint).create_bucket(Bucket=BUCKET)
    trust = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}]}
    return _aws("iam", endpoint).create_role(RoleName="stack-node", AssumeRolePolicyDocument=json.dumps(trust))[
        "Role"]["Arn"]


def _one_wheelhouse(root: Path, replicas: list[Replica]) -> None:
    """The nodes' wheelhouse, built once (each replica would build the same one in its data dir)."""
    from spotbroker.broker.launch.skypilot.wheel import wheelhouse

    built = wheelhouse(root / "wheels")
    for r in replicas:
        shutil.copytree(built.parent, Path(r.env["SPOTBROKER_DATA_DIR"]) / "wheels")


def broker_env(database_url: str, role: str, api_server: str) -> dict[str, str]:
    """The replicas' settings: docker-compose.yml's broker services name the
    same ones (test_stack.py checks it), less what paces this test."""
    return {"SPOTBROKER_DATABASE_URL": database_url, "SPOTBROKER_LAUNCHER": "skypilot",
            "SPOTBROKER_SECRET_KEY": SECRET, "SKYPILOT_API_SERVER_ENDPOINT": api_server,
            "SPOTBROKER_NODE_ROLE_ARN": role, "SPOTBROKER_CHECKPOINT_ROOT": f"s3://{BUCKET}/ckpt",
            "SPOTBROKER_LOCAL_LAUNCHER": "false",
            # pacing: a short lease and pass, a janitor that sweeps within the test, clusters named per run
            "SPOTBROKER_LEASE_SECONDS": str(LEASE_S), "SPOTBROKER_RECONCILE_INTERVAL": str(PASS_S),
            "SPOTBROKER_SKYPILOT_CLUSTER_PREFIX": f"stack{int(time.time()) % 100000}",
            "SPOTBROKER_SKYPILOT_JANITOR_INTERVAL": "30"}


@contextmanager
def stack(sky_aws: SkyAws, root: Path, replicas: int = 2) -> Iterator[Stack]:
    """The stack, every replica ready to launch; all of it stopped and removed after."""
    url = create_pg_database("spotbroker_stack")
    engine = make_engine(url)
    started: list[Replica] = []
    try:
        migrate.upgrade(engine)
        factory = make_session_factory(engine)
        with transaction(factory) as s:
            _, token = auth.create_team(s, "ml")
        role = _node_role(sky_aws.endpoint)
        # (only AWS is allowed in SkyPilot's config: skyenv.py)
        start_api_server()  # the one SkyPilot API server, its own process, shared by the replicas
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
        env.update(broker_env(url, role, f"http://127.0.0.1:{os.environ['SKYPILOT_API_SERVER_LOCAL_PORT']}"))
        started = [Replica(chr(ord("a") + i), env, root) for i in range(replicas)]
        _one_wheelhouse(root, started)
        for r in started:
            r.start()
        for r in started:
            try:
                # 15 s on a quiet machine; over 150 s in one CI run, where this file starts beside the
                # other heaviest (each with SkyPilot's server, whose workers import SkyPilot under load)
                wait_for(r.ready, 300, f"replica {r.name} ready to launch (see {r.log})", every=1.0)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; its /readyz said: {r.last_ready}") from None
        yield Stack(sky_aws, factory, started, {"Authorization": f"Bearer {token}"})
    except BaseException:
        for r in started:
            print(f"--- replica {r.name}'s log (tail)\n{r.log.read_text()[-3000:] if r.log.exists() else ''}")
        raise
    finally:
        for r in started:
            r.stop()
        engine.dispose()
        drop_pg_database(url)


@dataclass
class Handover:
    victim: Replica            # the replica killed as it launched the job
    other: Replica             # the one that took the job's next step
    attempt_id: int
    unlaunched: bool           # the attempt had no handle yet when the victim died
    taken_s: float             # kill -> the other's claim of the job (or the handle stored)


def kill_while_launching(st: Stack, job_id: int) -> Handover:
    """Kill (SIGKILL) the replica stepping the job as it launches (its lease
    names its pid) and time how long until another replica takes the job's
    next step."""
    by_pid = {r.proc.pid: r for r in st.replicas if r.proc is not None and r.proc.poll() is None}

    def launching() -> tuple[Replica, int, bool] | None:
        with st.factory() as s:
            job = s.get(Job, job_id)
            attempt = s.scalars(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.id.desc())).first()
            assert job.state not in ("FAILED", "HELD"), (job.state, job.reason)
            if attempt is None or job.lease_owner is None:
                return None
            replica = by_pid.get(int(job.lease_owner.split(":")[1]))
            return (replica, attempt.id, attempt.handle is None) if replica is not None else None
    victim, attempt_id, unlaunched = wait_for(launching, 90, "the launch", every=0.02)
    victim.kill()
    killed_at = time.monotonic()
    others = {str(pid) for pid, r in by_pid.items() if r is not victim}

    def claimed() -> bool:
        with st.factory() as s:
            job, attempt = s.get(Job, job_id), s.get(Attempt, attempt_id)
            return attempt.handle is not None or (job.lease_owner or "::").split(":")[1] in others
    wait_for(claimed, 60, "another replica's step", every=0.05)
    taken_s = time.monotonic() - killed_at
    with st.factory() as s:
        owner = (s.get(Job, job_id).lease_owner or "::").split(":")[1]
    other = next((r for pid, r in by_pid.items() if str(pid) == owner), None) or \
        next(r for r in by_pid.values() if r is not victim)
    return Handover(victim, other, attempt_id, unlaunched, taken_s)


def handle_of(st: Stack, attempt_id: int, timeout: float = 60) -> dict:
    def handled() -> dict | None:
        with st.factory() as s:
            return s.get(Attempt, attempt_id).handle
    return wait_for(handled, timeout, "the launch's handle stored")


def cancel_and_wait_clean(st: Stack, replica: Replica, job_id: int, timeout: float = 120) -> float:
    """Cancel through `replica`; seconds until no instance is left in moto."""
    r = httpx.post(f"{replica.url}/v1/jobs/{job_id}/cancel", headers=st.headers, timeout=30)
    assert r.status_code == 200, r.text
    at = time.monotonic()
    wait_for(lambda: not st.sky.instances(), timeout, "no instance left after the cancel")
    return time.monotonic() - at
