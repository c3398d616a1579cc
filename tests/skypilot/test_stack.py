"""The whole stack, as one test (the processes of stack.py: PostgreSQL, two
broker replicas, one SkyPilot API server they share, moto serving S3, STS,
IAM and EC2, SPOTBROKER_NODE_ROLE_ARN set).

A GPU job placed on AWS launches a spot instance in moto through SkyPilot,
in the zone the policy chose. The replica stepping the job is killed with
SIGKILL as it launches; the other one takes the job's next step once the
lease runs out (re-attaching to the launch the dead one sent, or sending
it: one instance either way), follows it, cancels it on request and
leaves no instance.

moto starts no machine (no SSH, no agent): the agent's part is played by
the test over the agent API, with the attempt's own token.
"""
from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import yaml
from support.skyenv import SkyAws
from support.stack import (
    LEASE_S,
    PASS_S,
    SECRET,
    Replica,
    Stack,
    broker_env,
    cancel_and_wait_clean,
    handle_of,
    kill_while_launching,
    stack,
    wait_for,
)

from spotbroker.broker.recovery.agent_channel import agent_token
from spotbroker.broker.settings import Settings
from spotbroker.broker.store.models import Attempt, Job

REPO = Path(__file__).resolve().parents[2]

# Logs shipped to one replica are read through another (the log store is the database).
LOGS_ACROSS_REPLICAS = True


def test_compose_runs_the_stack_this_test_runs() -> None:
    """docker-compose.yml is this topology (PostgreSQL, moto, one SkyPilot API
    server, two broker replicas) with the settings the replicas get here,
    less what paces the test; the stack makes its team in the database and
    migrates itself, where compose has an admin token and a `migrate` service."""
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    assert {"postgres", "moto", "skypilot-api", "migrate", "broker", "broker-2"} <= set(services)
    pacing = {"SPOTBROKER_LEASE_SECONDS", "SPOTBROKER_RECONCILE_INTERVAL", "SPOTBROKER_SKYPILOT_CLUSTER_PREFIX",
              "SPOTBROKER_SKYPILOT_JANITOR_INTERVAL"}
    ours = set(broker_env("postgresql://", "arn:aws:iam::123456789012:role/x", "http://127.0.0.1:1")) - pacing
    for name in ("broker", "broker-2"):
        env = services[name]["environment"]
        names = {k for k in env if k.startswith(("SPOTBROKER_", "SKYPILOT_"))}
        assert names - {"SPOTBROKER_ADMIN_TOKEN", "SPOTBROKER_MIGRATE_ON_START"} == ours, name
        assert (env["SPOTBROKER_LAUNCHER"], env["SPOTBROKER_LOCAL_LAUNCHER"]) == ("skypilot", "false")
        assert env["SKYPILOT_API_SERVER_ENDPOINT"] == "http://skypilot-api:46580"
        assert env["SPOTBROKER_NODE_ROLE_ARN"] and env["AWS_ENDPOINT_URL"] == "http://moto:5000"


@pytest.mark.slow
@pytest.mark.timeout(600)  # 104-163 s on the machines of two rounds; over 280 s on one 2.5 times slower
def test_the_stack_launches_hands_over_between_replicas_and_cancels(sky_aws: SkyAws, pg_server, tmp_path) -> None:
    import sky

    with stack(sky_aws, tmp_path) as st:
        for r in st.replicas:
            assert r.ready()["launch"] == {"launcher": "skypilot", "ready": True,
                                           "detail": "SkyPilot can launch on aws"}
        job_id = st.submit(st.replicas[0])
        handover = kill_while_launching(st, job_id)
        print(f"STACK replica killed -> job's next step by the other: {handover.taken_s:.2f} s "
              f"(lease {LEASE_S:g} s, pass {PASS_S:g} s, unlaunched at the kill: {handover.unlaunched})")
        if handover.unlaunched:
            assert handover.taken_s <= LEASE_S + PASS_S + 5, handover  # (a loaded machine's slack)
        handle = handle_of(st, handover.attempt_id)

        (instance,) = wait_for(st.sky.instances, 90, "the spot instance in moto")
        with st.factory() as s:
            attempt = s.get(Attempt, handover.attempt_id)
            zones = {z["ZoneId"]: z["ZoneName"] for z in
                     st.sky.ec2().describe_availability_zones()["AvailabilityZones"]}
            assert (attempt.state, attempt.cloud, attempt.use_spot) == ("LAUNCHING", "aws", True)
            assert instance["Placement"]["AvailabilityZone"] == (attempt.zone or zones[attempt.zone_id]), \
                "launched in the zone the policy chose"
            assert instance.get("InstanceLifecycle") == "spot" and instance["InstanceType"] == attempt.instance_type
        time.sleep(2 * PASS_S)
        assert len(st.sky.instances()) == 1, "launched once"

        _logs(st, handover.victim, handover.other, job_id, handover.attempt_id)

        cleaned_s = cancel_and_wait_clean(st, handover.other, job_id)
        print(f"STACK no instance {cleaned_s:.1f} s after the cancel")
        with st.factory() as s:
            assert s.get(Job, job_id).state == "CANCELLED"
        wait_for(lambda: sky.get(sky.status(cluster_names=[handle["cluster"]])) == [], 90,
                 "the cluster's record gone")


def _logs(st: Stack, victim: Replica, other: Replica, job_id: int, attempt_id: int) -> None:
    """The agent's lines (the test plays the agent: moto runs no node), read through the replicas."""
    token = agent_token(Settings(secret_key=SECRET, _env_file=None).signing_key(), attempt_id)
    line = b"epoch 1 loss 0.42\n"
    r = httpx.post(f"{other.url}/v1/agent/logs", content=line,
                   headers={"Authorization": f"Bearer {token}", "X-Log-Offset": "0"}, timeout=30)
    assert r.status_code == 200, r.text
    r = httpx.get(f"{other.url}/v1/jobs/{job_id}/logs", headers=st.headers, timeout=30)
    assert r.status_code == 200 and r.text == line.decode(), r.text
    if LOGS_ACROSS_REPLICAS:  # shipped to one replica, read through another (the killed one, restarted)
        victim.start()
        wait_for(victim.ready, 150, "the killed replica back", every=1.0)
        r = httpx.get(f"{victim.url}/v1/jobs/{job_id}/logs", headers=st.headers, timeout=30)
        assert r.status_code == 200 and r.text == line.decode(), r.text
