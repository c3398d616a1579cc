"""Local jobs with an s3:// checkpoint root hold only their own job's
credentials, against moto's S3 and STS with IAM enforced (the broker is an
IAM user allowed to assume the node role; the node role may do anything in
the bucket; the broker's session policy narrows each job's credentials:
tests/support/iamfixtures.py says what moto enforces and what the tests add).

A training run flushes to S3 with its scoped credentials, is preempted, and
resumes on the next attempt from the first attempt's checkpoint; its agent
renews the credentials over its channel; another team's job, holding its own
scoped credentials, is refused when it writes into the first job's prefix
or reads its checkpoint. A job whose `secrets` carry its own AWS keys (an IAM
user of its own, allowed only its own bucket) reads its dataset with them,
while its checkpoints go through the
scoped credentials, which no standard variable of the trainer holds."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from support.helpers import wait_for, wait_state
from support.iamfixtures import aws_iam, make_user, session_policies_enforced  # noqa: F401  (fixtures, found by name)
from support.s3fixtures import moto_endpoint  # noqa: F401

from spotbroker.broker.recovery.agent_channel import agent_token

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]
REPO = Path(__file__).resolve().parents[2]
# Periodic saves every 5 steps, as the trainer says (the broker's fitted interval would be minutes).
CODE_INTERVAL = {"interval": "code"}
TRAIN = ["python", str(REPO / "examples" / "train.py"), "--steps", "120", "--seed", "3", "--every-steps", "5",
         "--log-every", "1", "--step-seconds", "0.15"]
# The agent renews 6 s after start, then every 15 s, its floor (sessions last 900 s, the least STS allows).
RENEW_EARLY = {"SPOTBROKER_CREDENTIALS_LEAD_SECONDS": "894"}


@pytest.fixture
def settings(settings, aws_iam, session_policies_enforced):  # noqa: F811
    settings.checkpoint_root = f"s3://{aws_iam.bucket}/root"
    settings.node_role_arn = aws_iam.role_arn
    settings.node_credentials_seconds = 900
    return settings


def sessions() -> list:
    from moto.sts.models import sts_backends

    return sts_backends["123456789012"]["aws"].assumed_roles


def sessions_of(attempt_id: int, since: int) -> list:
    """The attempt's sessions among those made after `since` (how many there
    were when the test began): the worker's moto lives across tests, whose
    fresh databases number their attempts from 1 again."""
    return [a for a in sessions()[since:] if a.session_name.endswith(f"-a{attempt_id}")]


def test_a_job_flushes_and_resumes_with_only_its_scoped_credentials(api, team_headers, settings, aws_iam):  # noqa: F811
    since = len(sessions())
    h = team_headers("vision")
    job_id = api.post("/v1/jobs", json={"name": "train", "run": shlex.join(TRAIN), "max_restarts": 0,
                                        "checkpoint": CODE_INTERVAL,
                                        "envs": RENEW_EARLY, "resources": {"accelerators": "T4:1"}},
                      headers=h).json()["id"]
    job = wait_state(api, h, job_id, {"RUNNING"}, timeout=60)
    first_id = job["attempts"][0]["id"]
    wait_for(lambda: "step=12 " in api.get(f"/v1/jobs/{job_id}/logs", headers=h).text, timeout=60,
             what="training to be under way")
    # The agent renewed the launch's session over its channel (a second STS session, same name).
    wait_for(lambda: len(sessions_of(first_id, since)) >= 2, timeout=30, what="the agent to renew its credentials")
    assert all(s.session_name == f"sb-vision-j{job_id}-a{first_id}" and s.role_arn == aws_iam.role_arn
               for s in sessions_of(first_id, since))
    # Asked twice at once (a multi-node attempt's agents renew together): one STS session, shared.
    bearer = {"Authorization": f"Bearer {agent_token(settings.signing_key(), first_id)}"}
    answers = [api.post("/v1/agent/credentials", headers=bearer) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200] and answers[0].json() == answers[1].json()
    assert answers[0].headers["cache-control"] == "no-store"
    assert answers[0].json()["credentials"]["access_key_id"] != aws_iam.broker_key
    assert api.post(f"/v1/jobs/{job_id}/simulate-preemption", headers=h).status_code == 202

    job = wait_state(api, h, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    assert job["state"] == "SUCCEEDED", (job, api.get(f"/v1/jobs/{job_id}/logs", headers=h).text[-3000:])
    first, second = job["attempts"]
    assert first["state"] == "PREEMPTED" and sessions_of(second["id"], since)
    events = api.get(f"/v1/jobs/{job_id}/events", headers=h).json()["events"]
    resumed = next((e for e in events if e["type"] == "resumed" and e["attempt_id"] == second["id"]), None)
    assert resumed, events
    assert resumed["data"]["step"] > 0 and f"/vision/{job_id}/{first_id}/step-" in resumed["data"]["uri"]
    s3 = aws_iam.client("s3")  # the broker's own view of the bucket
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=aws_iam.bucket, Prefix=f"root/vision/{job_id}/")["Contents"]]
    assert any(k.startswith(f"root/vision/{job_id}/{second['id']}/step-") for k in keys)

    # Once the attempt is over, its token gets no more credentials.
    token = agent_token(settings.signing_key(), second["id"])
    r = api.post("/v1/agent/credentials", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 409 and r.headers["content-type"] == "application/problem+json"

    # Another team's job holds its own scoped credentials: the first job's prefix refuses it.
    other = team_headers("speech")
    probe = (
        "import sys, obstore; from spotbroker.agent.checkpoint.storage import Storage\n"
        f"job = Storage('s3://{aws_iam.bucket}/root/vision/{job_id}')\n"
        "for what, call in [('write', lambda: job.put('666/step-000000000001/MANIFEST.json', b'evil')),\n"
        f"                  ('read', lambda: job.get('{first_id}/' + sys.argv[1]))]:\n"
        "    try:\n"
        "        call(); print(what, 'allowed')\n"
        "    except obstore.exceptions.PermissionDeniedError:\n"
        "        print(what, 'refused')\n"
    )
    manifest = next(k for k in keys if k.startswith(f"root/vision/{job_id}/{first_id}/") and
                    k.endswith("MANIFEST.json")).split(f"/{first_id}/", 1)[1]
    run = f"python -c {shlex.quote(probe)} {shlex.quote(manifest)}; env"
    probe_id = api.post("/v1/jobs", json={"name": "probe", "run": run}, headers=other).json()["id"]
    done = wait_state(api, other, probe_id, {"SUCCEEDED", "FAILED"}, timeout=60)
    # The whole output, up to `env`'s last variable (once, under load, the job
    # was seen ended with only its first line in the log: the agent now ships
    # the log before the exit, but that run's cause is not pinned down).
    def whole_output() -> str | None:
        text = api.get(f"/v1/jobs/{probe_id}/logs", headers=other).text
        return text if "SPOTBROKER_STORAGE_CREDENTIALS_FILE=" in text else None
    out = wait_for(whole_output, timeout=30, what="the probe's output")
    assert done["state"] == "SUCCEEDED", out
    assert "write refused" in out and "read refused" in out, out
    assert aws_iam.broker_secret not in out and aws_iam.broker_key not in out  # never the broker's keys
    assert "SPOTBROKER_STORAGE_CREDENTIALS_FILE=" in out  # its own STS session, in the agent's file
    assert "AWS_SESSION_TOKEN=" not in out and "AWS_ACCESS_KEY_ID=" not in out  # never in the standard variables


# The jobs' interpreter has the agent's dependencies only (no boto3): obstore, through the library, reads
# the standard AWS variables as any SDK's default chain does.
READ_OWN_DATA = (
    "import sys; from spotbroker.agent.checkpoint.storage import Storage\n"
    "print('own data', Storage('s3://' + sys.argv[1]).get('data.csv').decode())\n"
)


def test_a_jobs_own_keys_read_its_own_data_while_checkpoints_use_the_scoped_ones(api, team_headers, settings,
                                                                                 aws_iam, moto_endpoint):  # noqa: F811
    """On SkyPilot a trainer reads its dataset with the keys in its `secrets`
    (or the node's instance profile); under spotbroker it must still, and
    its checkpoints must go through the attempt's scoped credentials.
    (Failed before the credentials left the standard variables: the scoped
    keys shadowed the job's own and its read got a 403.)"""
    since = len(sessions())
    bucket, key, secret = make_user(moto_endpoint)
    user_s3 = aws_iam.client("s3", key, secret)
    user_s3.put_object(Bucket=bucket, Key="data.csv", Body=b"x,y\n1,2")
    with pytest.raises(user_s3.exceptions.ClientError, match="AccessDenied"):  # not the broker's bucket
        user_s3.list_objects_v2(Bucket=aws_iam.bucket, Prefix="root/")
    h = team_headers("vision")
    run = (f"python -c {shlex.quote(READ_OWN_DATA)} {bucket} && env && "
           f"python {REPO / 'examples' / 'train.py'} --steps 10 --seed 3 --every-steps 5 --log-every 1")
    job_id = api.post("/v1/jobs", json={
        "name": "own-data", "run": run, "max_restarts": 0,
        "checkpoint": CODE_INTERVAL, "resources": {"accelerators": "T4:1"},
        "envs": {"AWS_ENDPOINT_URL": moto_endpoint, "AWS_REGION": "us-east-1"},
        "secrets": {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret}}, headers=h).json()["id"]
    job = wait_state(api, h, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    out = api.get(f"/v1/jobs/{job_id}/logs", headers=h).text
    assert job["state"] == "SUCCEEDED", (job, out[-3000:])
    assert "own data x,y\n1,2" in out, out
    attempt_id = job["attempts"][0]["id"]
    keys = [o["Key"] for o in aws_iam.client("s3").list_objects_v2(
        Bucket=aws_iam.bucket, Prefix=f"root/vision/{job_id}/{attempt_id}/")["Contents"]]
    assert any(k.endswith("/MANIFEST.json") for k in keys), keys  # written with the scoped session
    environment = dict(line.split("=", 1) for line in out.splitlines()
                       if "=" in line and line.split("=", 1)[0].isupper())
    assert environment["AWS_ACCESS_KEY_ID"] == key and environment["AWS_SECRET_ACCESS_KEY"] == secret
    assert environment["AWS_REGION"] == "us-east-1" and "AWS_SESSION_TOKEN" not in environment
    scoped = [s.access_key_id for s in sessions_of(attempt_id, since)]
    assert scoped and not any(k in out for k in scoped)  # no scoped key anywhere in the trainer's environment
    assert "SPOTBROKER_STORAGE_CREDENTIALS" not in environment  # the agent's file replaced the launch's variable


def test_an_s3_root_without_a_node_role_fails_the_launch_saying_what_to_set(api, team_headers, settings):
    settings.node_role_arn = None
    h = team_headers("vision")
    job_id = api.post("/v1/jobs", json={"name": "x", "run": "true"}, headers=h).json()["id"]
    job = wait_state(api, h, job_id, {"FAILED", "SUCCEEDED"}, timeout=60)
    assert job["state"] == "FAILED" and job["attempts"][0]["reason"] == "launch_error", job
    assert "SPOTBROKER_NODE_ROLE_ARN" in job["reason"] and "never hands out its own keys" in job["reason"]
