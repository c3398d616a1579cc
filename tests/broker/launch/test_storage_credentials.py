"""A node's storage credentials allow its own job and nothing else, checked
against moto's S3 and STS with IAM enforced (tests/support/iamfixtures.py says
exactly what moto enforces and what it does not).

The node side is the real one: the minted credentials are written as the
agent writes its credentials file, and the checkpoint library's `Storage`
(obstore) reads them through its credential provider and speaks signed S3 to
moto. Two ways of enforcing the scope, the same assertions:

* ``session``: the production shape. The node role may do anything in the
  bucket (as an operator's role would); only the broker's session policy
  narrows it, and moto is extended with AWS's session-policy rule (evaluated
  by moto's own policy engine).
* ``role``: moto exactly as it is. The node role's own policy is the document
  the broker sends as the session policy, so moto's unmodified evaluator
  judges the broker's document on every request.

Not enforced by moto either way: the `s3:prefix` condition on ListBucket
(listing another prefix is therefore not asserted here; real S3 refuses it).
"""
from __future__ import annotations

import json
from datetime import UTC, datetime

import obstore
import pytest
from support.iamfixtures import (  # noqa: F401  (fixtures, found by name)
    IamWorld,
    as_broker,
    aws_iam,
    iam_enforced,
    make_world,
    session_policies_enforced,
    session_policy_of,
)
from support.s3fixtures import moto_endpoint  # noqa: F401

from spotbroker.agent import credentials as node_credentials
from spotbroker.agent import protocol
from spotbroker.agent.checkpoint.storage import Storage
from spotbroker.broker.launch import storage_credentials as sc
from spotbroker.broker.settings import Settings

TEAM, OTHER_TEAM, JOB, OTHER_JOB, ATTEMPT, EARLIER = "vision", "speech", 41, 42, 702, 701
CODE = f"{TEAM}/uploads/{'a' * 64}.tar.gz"


def settings_for(world: IamWorld, tmp_path, role_arn: str | None = None) -> Settings:
    return Settings(data_dir=tmp_path, checkpoint_root=f"s3://{world.bucket}/root",
                    node_role_arn=role_arn or world.role_arn, _env_file=None)


def the_scope(bucket: str) -> sc.Scope:
    root = f"s3://{bucket}/root"
    return sc.scope(root, TEAM, JOB, ATTEMPT, (f"{root}/{CODE}",))


def seed(world: IamWorld) -> None:
    """What the broker and other jobs wrote, with the broker's own identity."""
    s3 = world.client("s3")
    for key in (f"root/{TEAM}/{JOB}/{EARLIER}/step-000000000010/MANIFEST.json", f"root/{CODE}",
                f"root/{TEAM}/{OTHER_JOB}/800/step-000000000001/MANIFEST.json",
                f"root/{OTHER_TEAM}/{JOB}/900/step-000000000001/MANIFEST.json",
                f"root/{TEAM}/uploads/{'b' * 64}.tar.gz", "secret_key"):
        s3.put_object(Bucket=world.bucket, Key=key, Body=b"{}")


def as_node(minted: sc.NodeCredentials, tmp_path, monkeypatch) -> None:
    """This process becomes the node's trainer: the agent's credentials file, and no AWS keys of its own."""
    path = tmp_path / protocol.CREDENTIALS_FILE
    node_credentials.write(path, minted.document())
    monkeypatch.setenv(protocol.ENV_STORAGE_CREDENTIALS_FILE, str(path))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def refused(call) -> bool:
    try:
        call()
    except obstore.exceptions.PermissionDeniedError:
        return True
    except Exception as exc:  # obstore names 403s PermissionDenied; anything else is a test failure
        raise AssertionError(f"expected a 403, got {type(exc).__name__}: {exc}") from None
    return False


@pytest.fixture(params=["session", "role"])
def world(request, moto_endpoint, monkeypatch):  # noqa: F811
    """An IAM world enforcing the scope one of the two ways (the module's doc)."""
    if request.param == "session":
        request.getfixturevalue("session_policies_enforced")
        return request.getfixturevalue("aws_iam")
    world = make_world(moto_endpoint, role_policy=lambda bucket: sc.s3_policy(the_scope(bucket)))
    as_broker(world, monkeypatch)
    request.getfixturevalue("iam_enforced")
    return world


def test_the_nodes_credentials_reach_its_job_and_nothing_else(world, tmp_path, monkeypatch):
    seed(world)
    minted = sc.mint(settings_for(world, tmp_path), the_scope(world.bucket), "sb-vision-j41-a702")
    assert minted.provider == "s3" and minted.credentials["access_key_id"] != world.broker_key
    assert world.broker_secret not in json.dumps(minted.document())  # never the broker's own keys
    as_node(minted, tmp_path, monkeypatch)
    root = f"s3://{world.bucket}/root"
    attempt = Storage(f"{root}/{TEAM}/{JOB}/{ATTEMPT}")
    job = Storage(f"{root}/{TEAM}/{JOB}")

    # Allowed: write its attempt's prefix (multipart too), read the job's earlier attempt and its code.
    attempt.put("step-000000000020/part-0.bin", b"x" * 1024)
    Storage(attempt.uri, multipart_threshold=5 << 20, part_size=5 << 20).put("step-000000000020/mp.bin",
                                                                            b"z" * (11 << 20))
    attempt.put("step-000000000020/MANIFEST.json", b"{}")
    assert attempt.get("step-000000000020/part-0.bin") == b"x" * 1024
    assert job.get(f"{EARLIER}/step-000000000010/MANIFEST.json") == b"{}"
    assert {o.key for o in job.list()} >= {f"{EARLIER}/step-000000000010/MANIFEST.json"}
    assert Storage(f"{root}/{TEAM}/uploads").get(f"{'a' * 64}.tar.gz") == b"{}"
    # Deleting its own objects. (obstore deletes in bulk, `POST ?delete`, which moto checks against
    # the bucket's ARN where S3 checks each key's: the single-key DELETE is what moto can judge.)
    c = minted.credentials
    node_s3 = world.client("s3", c["access_key_id"], c["secret_access_key"], c["token"])
    node_s3.delete_object(Bucket=world.bucket, Key=f"root/{TEAM}/{JOB}/{ATTEMPT}/step-000000000020/part-0.bin")
    assert not attempt.exists("step-000000000020/part-0.bin")
    with pytest.raises(node_s3.exceptions.ClientError, match="AccessDenied"):
        node_s3.delete_object(Bucket=world.bucket, Key=f"root/{TEAM}/{JOB}/{EARLIER}/step-000000000010/MANIFEST.json")

    # Refused: another job's or team's prefix, an earlier attempt's checkpoint, the broker's own files.
    assert refused(lambda: Storage(f"{root}/{TEAM}/{OTHER_JOB}/800").put("step-000000000002/x", b"evil"))
    assert refused(lambda: Storage(f"{root}/{OTHER_TEAM}/{JOB}/900").put("step-000000000002/x", b"evil"))
    assert refused(lambda: job.put(f"{EARLIER}/step-000000000010/MANIFEST.json", b"evil"))
    assert refused(lambda: Storage(f"{root}/{OTHER_TEAM}/{JOB}/900").get("step-000000000001/MANIFEST.json"))
    assert refused(lambda: Storage(f"{root}/{TEAM}/{OTHER_JOB}/800").get("step-000000000001/MANIFEST.json"))
    assert refused(lambda: Storage(f"{root}/{TEAM}/uploads").get(f"{'b' * 64}.tar.gz"))
    assert refused(lambda: Storage(f"s3://{world.bucket}").get("secret_key"))
    assert refused(lambda: Storage(f"{root}/{TEAM}/uploads").put(f"{'a' * 64}.tar.gz", b"evil"))
    assert world.client("s3").get_object(Bucket=world.bucket, Key=f"root/{CODE}")["Body"].read() == b"{}"


def test_the_session_policy_is_what_narrows_the_role(aws_iam, session_policies_enforced, tmp_path, monkeypatch):  # noqa: F811
    """The role may read the whole bucket; the broker's session is what
    refuses another team's checkpoint (moto recorded the policy sent)."""
    seed(aws_iam)
    minted = sc.mint(settings_for(aws_iam, tmp_path), the_scope(aws_iam.bucket), "sb-vision-j41-a702")
    sent = json.loads(session_policy_of(minted.credentials["access_key_id"]))
    assert sent == sc.s3_policy(the_scope(aws_iam.bucket))
    other = f"root/{OTHER_TEAM}/{JOB}/900/step-000000000001/MANIFEST.json"
    sts = aws_iam.client("sts")
    bare = sts.assume_role(RoleArn=aws_iam.role_arn, RoleSessionName="no-policy")["Credentials"]
    unscoped = aws_iam.client("s3", bare["AccessKeyId"], bare["SecretAccessKey"], bare["SessionToken"])
    assert unscoped.get_object(Bucket=aws_iam.bucket, Key=other)["Body"].read() == b"{}"
    as_node(minted, tmp_path, monkeypatch)
    assert refused(lambda: Storage(f"s3://{aws_iam.bucket}/root/{OTHER_TEAM}").get(f"{JOB}/900/step-000000000001/"
                                                                                  "MANIFEST.json"))


def test_a_session_names_the_attempt_and_lasts_what_the_setting_says(aws_iam, tmp_path):  # noqa: F811
    settings = settings_for(aws_iam, tmp_path)
    settings.node_credentials_seconds = 900
    name = sc.session_name(TEAM, JOB, ATTEMPT)
    minted = sc.mint(settings, the_scope(aws_iam.bucket), name)
    from moto.sts.models import sts_backends

    session = next(a for a in sts_backends["123456789012"]["aws"].assumed_roles
                   if a.access_key_id == minted.credentials["access_key_id"])
    assert session.session_name == name == "sb-vision-j41-a702"
    lasts = (minted.expires_at - datetime.now(UTC)).total_seconds()
    assert 890 < lasts <= 900 and session.role_arn == aws_iam.role_arn
    # The launch's one variable: spotbroker's own name, never the standard ones (those stay the user's).
    assert list(minted.env) == [protocol.ENV_STORAGE_CREDENTIALS]
    assert json.loads(minted.env[protocol.ENV_STORAGE_CREDENTIALS]) == minted.document()
    assert minted.document()["bucket"] == aws_iam.bucket
    assert minted.options == {"endpoint": aws_iam.endpoint, "region": "us-east-1"}  # the node talks to the broker's S3
    assert "AKIA" not in repr(minted) and minted.credentials["secret_access_key"] not in repr(minted)


def test_no_role_or_a_refused_assume_role_is_a_clear_launch_error(moto_endpoint, tmp_path, monkeypatch):  # noqa: F811
    untrusted = make_world(moto_endpoint, trusted=False)
    as_broker(untrusted, monkeypatch)
    scope = the_scope(untrusted.bucket)
    with pytest.raises(sc.NoCredentials, match="SPOTBROKER_NODE_ROLE_ARN") as no_role:
        sc.mint(Settings(data_dir=tmp_path, checkpoint_root=f"s3://{untrusted.bucket}/root", _env_file=None),
                scope, "sb-x")
    assert untrusted.broker_secret not in str(no_role.value)
    from moto.core.authorization import enable_iam_authentication

    with enable_iam_authentication(), pytest.raises(sc.NoCredentials, match="AccessDenied") as refused_:
        sc.mint(settings_for(untrusted, tmp_path), scope, "sb-x")
    assert untrusted.role_arn in str(refused_.value) and untrusted.broker_secret not in str(refused_.value)


def test_the_policy_is_small_and_wildcards_in_paths_are_refused():
    scope = sc.scope("s3://b/root", "t", 1, 2, ("s3://b/root/t/uploads/" + "c" * 64 + ".tar.gz",))
    assert (scope.write, scope.read) == ("root/t/1/2/", "root/t/1/")
    assert len(json.dumps(sc.s3_policy(scope), separators=(",", ":"))) < 1200  # STS takes 2048
    with pytest.raises(sc.NoCredentials, match="widen"):
        sc.scope("s3://b/ro*t", "t", 1, 2)
    with pytest.raises(sc.NoCredentials, match="not in the checkpoint root's bucket"):
        sc.scope("s3://b/root", "t", 1, 2, ("s3://other/root/t/uploads/x.tar.gz",))
    assert sc.session_name("t" * 64, 123456, 7890123) == "sb-" + "t" * 44 + "-j123456-a7890123"
