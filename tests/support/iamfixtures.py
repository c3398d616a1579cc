"""AWS with IAM enforced, for the nodes' scoped storage credentials: moto's
server (real HTTP, real SigV4 signatures checked, real STS sessions).

What moto 5.2 enforces once `INITIAL_NO_AUTH_ACTION_COUNT` is 0
(`moto/iam/access_control.py`): every request must be signed by a known IAM
user's key or an STS session's (with its session token); the caller's
*identity* policies (a user's inline, attached and group policies; an assumed
role's inline and attached policies) must allow the action on the resource,
matched by ARN with wildcards, and an explicit Deny wins; `sts:AssumeRole`
also checks the role's trust policy. What it does not: an AssumeRole's
session `Policy` is recorded on the session but never evaluated; condition
operators other than `StringEquals` on `sts:ExternalId` are ignored (so an
`s3:prefix` condition on ListBucket does not limit listing); a bulk delete
(`POST ?delete`) is checked against the bucket's ARN, not each key's.

`session_policies_enforced` adds the missing AWS rules, in the test process
(the server is ThreadedMotoServer, in-process): a request made with an STS
session that was given a session policy must also be allowed by that policy,
as evaluated by moto's own `IAMPolicy` (a session's permissions are the
intersection of the role's policies and the session policy), and a bulk
delete must be allowed `s3:DeleteObject` on every key it names, as S3 checks
it (obstore deletes even one object that way). Everything else is moto as it
is.

    from support.iamfixtures import aws_iam, session_policies_enforced
"""
from __future__ import annotations

import html
import itertools
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import boto3
import pytest
from moto.core.authorization import enable_iam_authentication

from support.s3fixtures import REGION

_worlds = itertools.count(1)
ACCOUNT = "123456789012"  # moto's default account


@dataclass(frozen=True)
class IamWorld:
    endpoint: str
    bucket: str
    role_arn: str           # the node role: the operator's, allowed s3:* on the bucket
    broker_key: str         # the broker's own IAM user
    broker_secret: str

    def client(self, service: str, key: str | None = None, secret: str | None = None, token: str | None = None):
        return boto3.client(service, endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=key or self.broker_key,
                            aws_secret_access_key=secret or self.broker_secret, aws_session_token=token)


def _admin(endpoint: str, service: str):
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def make_world(endpoint: str, role_policy: Callable[[str], dict] | None = None, trusted: bool = True) -> IamWorld:
    """A bucket, the broker's IAM user (allowed sts:AssumeRole on the node
    role and s3:* on the bucket) and the node role (trusting that user,
    allowed `role_policy(bucket)`, by default s3:* on the bucket). Made while
    IAM is not yet enforced."""
    n = f"{os.getpid()}-{next(_worlds)}"
    bucket, user, role = f"iam-ckpt-{n}", f"broker-{n}", f"node-{n}"
    role_arn = f"arn:aws:iam::{ACCOUNT}:role/{role}"
    _admin(endpoint, "s3").create_bucket(Bucket=bucket)
    iam = _admin(endpoint, "iam")
    iam.create_user(UserName=user)
    key = iam.create_access_key(UserName=user)["AccessKey"]
    everything_in_bucket = {"Effect": "Allow", "Action": "s3:*",
                            "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}
    iam.put_user_policy(UserName=user, PolicyName="broker", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": role_arn}, everything_in_bucket]}))
    principal = f"arn:aws:iam::{ACCOUNT}:user/{user}" if trusted else f"arn:aws:iam::{ACCOUNT}:user/nobody"
    iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": {"AWS": principal}, "Action": "sts:AssumeRole"}]}))
    iam.put_role_policy(RoleName=role, PolicyName="node", PolicyDocument=json.dumps(
        role_policy(bucket) if role_policy else {"Version": "2012-10-17", "Statement": [everything_in_bucket]}))
    return IamWorld(endpoint, bucket, role_arn, key["AccessKeyId"], key["SecretAccessKey"])


def make_user(endpoint: str) -> tuple[str, str, str]:
    """A user of the cloud with a bucket of their own: (bucket, key, secret),
    an IAM user allowed s3:* on that bucket and nothing else (a trainer's
    own dataset, read with the user's own keys). Made with IAM not enforced."""
    n = f"{os.getpid()}-{next(_worlds)}"
    bucket, user = f"user-data-{n}", f"user-{n}"
    from moto.core.authorization import disable_iam_authentication

    with disable_iam_authentication():
        _admin(endpoint, "s3").create_bucket(Bucket=bucket)
        iam = _admin(endpoint, "iam")
        iam.create_user(UserName=user)
        key = iam.create_access_key(UserName=user)["AccessKey"]
        iam.put_user_policy(UserName=user, PolicyName="own-data", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": [
                f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]}))
    return bucket, key["AccessKeyId"], key["SecretAccessKey"]


@pytest.fixture
def iam_enforced() -> Iterator[None]:
    """IAM enforced on moto's servers of this process for the test."""
    with enable_iam_authentication():
        yield


def as_broker(world: IamWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's AWS environment (the broker's) becomes the broker's own IAM user."""
    for name, value in {"AWS_ENDPOINT_URL": world.endpoint, "AWS_ACCESS_KEY_ID": world.broker_key,
                        "AWS_SECRET_ACCESS_KEY": world.broker_secret, "AWS_REGION": REGION,
                        "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def aws_iam(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[IamWorld]:
    """A world (see `make_world`) with IAM enforced; this process is its broker (`as_broker`)."""
    world = make_world(moto_endpoint)
    as_broker(world, monkeypatch)
    with enable_iam_authentication():
        yield world


def session_policy_of(access_key_id: str) -> str | None:
    """The session policy moto recorded for an STS session's key (None: none given)."""
    from moto.sts.models import sts_backends

    for assumed in sts_backends[ACCOUNT]["aws"].assumed_roles:
        if assumed.access_key_id == access_key_id:
            return assumed.policy
    raise LookupError(access_key_id)


@pytest.fixture
def session_policies_enforced(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto, plus AWS's rule for session policies (see the module's doc)."""
    from moto.iam import access_control as ac

    identity_check = ac.IAMRequestBase.check_action_permitted

    def check_action_permitted(self, resource: str) -> None:
        identity_check(self, resource)  # moto's own: signature, identity policies, trust
        key = self._access_key
        if not isinstance(key, ac.AssumedRoleAccessKey):
            return
        policy = session_policy_of(key._access_key_id)
        if policy is None:
            return
        resources = [resource]
        if self._action == "s3:DeleteObject" and "/" not in resource.split(":::", 1)[-1]:  # POST ?delete
            body = self._body.decode() if isinstance(self._body, bytes) else str(self._body)
            resources = [f"{resource}/{html.unescape(k)}" for k in re.findall(r"<Key>(.*?)</Key>", body)]
        session = ac.IAMPolicy(policy)
        if not all(session.is_action_permitted(self._action, r) == ac.PermissionResult.PERMITTED
                   for r in resources):
            self._raise_access_denied()

    monkeypatch.setattr(ac.IAMRequestBase, "check_action_permitted", check_action_permitted)
