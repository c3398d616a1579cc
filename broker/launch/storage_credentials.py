"""A node's own storage credentials: minted per attempt, scoped to its job.

A checkpoint is a pickle: whoever can write into another team's prefix runs
code in that team's trainer. So a node never gets the broker's identity; it
gets credentials that allow exactly

* write (put, multipart, delete) under its attempt's prefix
  ``{root}/{team}/{job}/{attempt}/``;
* read and list under its job's prefix ``{root}/{team}/{job}/`` (resume from
  an earlier attempt);
* read the job's one code object ``{root}/{team}/uploads/{sha256}.tar.gz``,
  and each upload its file mounts name;
* read (and, unless mounted read-only, write) each bucket prefix its file
  mounts name: a bucket of the team's by name (``{root}/{team}/buckets/{name}/``),
  the team's own prefix (read), or a prefix the admin lists for the team
  (``broker/jobs/buckets.py``: read-only where listed so);

and nothing else: not the team's other jobs, not other teams, not the
broker's own files. One `Scope` says that for every cloud; each cloud has
its own way of minting it:

* **S3**: STS ``AssumeRole`` on the role the operator names
  (``SPOTBROKER_NODE_ROLE_ARN``) with an inline session ``Policy`` (the
  session can do only what both the role's policies and this one allow),
  ``DurationSeconds`` (``SPOTBROKER_NODE_CREDENTIALS_SECONDS``) and a session
  name that names the attempt, so CloudTrail shows whose node did what.
* **GCS**: a downscoped token: the broker's own application default
  credentials exchanged at Google's STS with a Credential Access Boundary
  (objectAdmin on the attempt's prefix, objectViewer on the job's and on the
  code object, by `resource.name.startsWith` conditions).
* **Azure**: SAS tokens, one per place: a directory SAS on the attempt's
  directory (write) and on the job's (read, list), a blob SAS on each code
  object, signed with the storage account's key (`azure_sas`).

A cloud root without a way to mint is refused at launch (`LaunchError`,
saying what to set): a node without credentials could not write a single
checkpoint, and the broker's own keys are never the fallback. A ``file://``
root needs none (the local launcher gives the job's user its directories).

Sessions end (S3: one hour by default). The node's agent asks the broker
for fresh ones over its channel (``POST /v1/agent/credentials``, answered by
`for_attempt` again) and keeps them in a file the trainer's checkpoint
library reads (``agent/credentials.py``, ``agent/checkpoint/storage.py``).
"""
from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import unquote, urlparse

from sqlalchemy.orm import Session

from spotbroker.agent import protocol
from spotbroker.agent.mounts import Mount
from spotbroker.broker.checkpoints.uris import attempt_prefix, job_prefix
from spotbroker.broker.jobs import buckets, mounts, uploads
from spotbroker.broker.jobs.spec import WorkdirUpload
from spotbroker.broker.jobs.states import LIVE_ATTEMPT_STATES
from spotbroker.broker.jobs.stored import spec_of
from spotbroker.broker.launch import azure_sas
from spotbroker.broker.launch.base import LaunchError
from spotbroker.broker.settings import Settings
from spotbroker.broker.store.models import Attempt, Team

# What IAM would read as a wildcard or a policy variable in a resource: a
# prefix holding one would widen the grant, so none is minted for it.
_WILDCARDS = re.compile(r"[*?]|\$\{")
_SESSION_NAME_BAD = re.compile(r"[^\w+=,.@-]")


class NoCredentials(LaunchError):
    """The node cannot be given credentials for this checkpoint root."""


class AttemptEnded(Exception):
    """Fresh credentials were asked for an attempt that is over."""


@dataclass(frozen=True)
class Scope:
    """What one attempt's node may touch in one bucket: keys are relative to
    the bucket, prefixes end with ``/``."""

    scheme: str               # s3 | gs | az
    bucket: str
    write: str                # the attempt's prefix: put, delete, multipart
    read: str                 # the job's prefix: get and list
    objects: tuple[str, ...]  # single objects to read (the job's code)
    mounts: tuple[Grant, ...] = ()  # the bucket prefixes its file mounts name


@dataclass(frozen=True)
class Grant:
    """A bucket prefix a file mount names: read and list, and write unless `read_only`."""

    bucket: str
    prefix: str               # ends with '/' ('' for the whole bucket)
    read_only: bool


@dataclass(frozen=True)
class NodeCredentials:
    """Minted credentials. `credentials` is obstore's shape for the provider
    (S3: access_key_id, secret_access_key, token; GCS: token; Azure: a SAS
    token per place, by its path: a directory's ends with '/'); `bucket` and
    `options` (endpoint, region; Azure: account) say the store they are for
    and where it is.
    The document carries them all: the launch's variable, the agent's file
    and the agent channel's answer. Secret: out of the repr."""

    provider: str
    expires_at: datetime
    bucket: str
    options: dict[str, str]
    credentials: dict[str, str] = field(repr=False)

    def document(self) -> dict:
        """The credentials file's (and the agent channel's) JSON."""
        return {"provider": self.provider, "expires_at": self.expires_at.isoformat(), "bucket": self.bucket,
                "options": dict(self.options), "credentials": dict(self.credentials)}

    @property
    def env(self) -> dict[str, str]:
        """What the node's environment gets at launch: the document under
        spotbroker's own name only. The provider's standard variables
        (AWS_ACCESS_KEY_ID, AWS_REGION, GOOGLE_*...) stay the user's: their
        own secrets or the node's identity reach their own data."""
        return {protocol.ENV_STORAGE_CREDENTIALS: json.dumps(self.document(), separators=(",", ":"))}


def scope(root: str, team: str, job_id: int, attempt_id: int, code_uris: tuple[str, ...] = (),
          mounts: tuple[Mount, ...] = ()) -> Scope:
    """The scope of attempt `attempt_id` of job `job_id` under checkpoint root `root`
    (`mounts`: the job's file mounts, resolved; its buckets are granted)."""
    scheme, bucket, write = _split(attempt_prefix(root, team, job_id, attempt_id))
    read = _split(job_prefix(root, team, job_id))[2]
    objects = []
    for uri in code_uris:
        code_scheme, code_bucket, key = _split(uri)
        if (code_scheme, code_bucket) != (scheme, bucket):
            raise NoCredentials(f"the job's code {uri} is not in the checkpoint root's bucket")
        objects.append(key.rstrip("/"))
    grants = []
    for mount in mounts:
        if mount.kind != "bucket":
            continue
        mount_scheme, mount_bucket, prefix = _split(mount.uri)
        if mount_scheme != scheme:
            raise NoCredentials(f"file_mounts {mount.path}: {mount.uri} is not in {scheme}:// storage, the only "
                                "kind this broker mints its nodes' credentials for")
        grants.append(Grant(mount_bucket, prefix, mount.read_only))
    return Scope(scheme, bucket, write, read, tuple(objects), tuple(dict.fromkeys(grants)))


def _split(uri: str) -> tuple[str, str, str]:
    """(scheme, bucket, key prefix ending with '/') of a cloud storage URI."""
    parsed = urlparse(uri)
    scheme = {"s3a": "s3"}.get(parsed.scheme.lower(), parsed.scheme.lower())
    path = unquote(parsed.path).strip("/")
    if _WILDCARDS.search(path) or _WILDCARDS.search(parsed.netloc):
        raise NoCredentials(f"{uri}: a '*', '?' or '${{' in a storage path would widen a node's credentials")
    return scheme, parsed.netloc, f"{path}/" if path else ""


def for_attempt(session: Session, attempt: Attempt, settings: Settings) -> NodeCredentials | None:
    """Fresh credentials for `attempt`'s node (None for a ``file://`` root);
    NoCredentials when the root is a cloud's and they cannot be minted."""
    root = settings.checkpoint_uri
    scheme = urlparse(root).scheme.lower()
    if scheme in ("file", ""):
        return None
    job = attempt.job
    team = session.get(Team, job.team_id).name
    spec = spec_of(job)
    # The uploads the job names (its workdir, its file mounts that are uploads): the node reads each.
    named = [spec.workdir, *spec.file_mounts.values()]
    code = tuple(dict.fromkeys(uploads.code_ref(settings, team, source.upload).uri
                               for source in named if isinstance(source, WorkdirUpload)))
    placed = tuple(mounts.resolved(settings, team, spec, buckets.allowed(session, job.team_id)))
    return mint(settings, scope(root, team, job.id, attempt.id, code, placed), session_name(team, job.id, attempt.id))


def mint(settings: Settings, wanted: Scope, name: str) -> NodeCredentials:
    """Credentials allowing exactly `wanted`, named `name` where the cloud keeps a name."""
    if wanted.scheme == "s3":
        return _mint_s3(settings, wanted, name)
    if wanted.scheme == "gs":
        return _mint_gcs(settings, wanted)
    if wanted.scheme == "az":
        return azure_sas.mint(settings, wanted)
    raise NoCredentials(f"the checkpoint root {settings.checkpoint_uri} is a {wanted.scheme}:// store, for which "
                        "the broker cannot mint a node's scoped credentials: use an s3://, gs://, az:// or file:// "
                        "root")


def live_attempt(session: Session, attempt_id: int) -> Attempt:
    """The attempt whose node asks for fresh credentials (its agent asks
    before the ones it holds end); AttemptEnded once it is over."""
    attempt = session.get(Attempt, attempt_id)
    if attempt is None or attempt.state not in LIVE_ATTEMPT_STATES:
        raise AttemptEnded(f"attempt {attempt_id} has ended: its node gets no more storage credentials")
    return attempt


def session_name(team: str, job_id: int, attempt_id: int) -> str:
    """Names the attempt in the cloud's audit log (STS: 2-64 of [\\w+=,.@-])."""
    tail = f"-j{job_id}-a{attempt_id}"
    return "sb-" + _SESSION_NAME_BAD.sub("-", team)[:64 - 3 - len(tail)] + tail


# --- S3 -------------------------------------------------------------------------------------------


def s3_policy(scope: Scope, partition: str = "aws") -> dict:
    """The session policy: the attempt writes its prefix, reads and lists the
    job's, reads its code. (Listing is limited by the ``s3:prefix`` key;
    reading another job's object is refused by its ARN.)"""
    bucket = f"arn:{partition}:s3:::{scope.bucket}"
    statements = [
        {"Sid": "WriteTheAttempt", "Effect": "Allow",
         "Action": ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
         "Resource": f"{bucket}/{scope.write}*"},
        {"Sid": "ReadTheJob", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": [f"{bucket}/{scope.read}*", *(f"{bucket}/{key}" for key in scope.objects)]},
        {"Sid": "ListTheJob", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": bucket,
         "Condition": {"StringLike": {"s3:prefix": [f"{scope.read}*"]}}},
    ]
    # The buckets its file mounts name, in as few statements as they take
    # (STS refuses a session policy past its packed size).
    arn = lambda grant: f"arn:{partition}:s3:::{grant.bucket}"  # noqa: E731
    if scope.mounts:
        statements.append({"Sid": "ReadTheMounts", "Effect": "Allow", "Action": "s3:GetObject",
                           "Resource": [f"{arn(g)}/{g.prefix}*" for g in scope.mounts]})
    for i, bucket in enumerate(dict.fromkeys(g.bucket for g in scope.mounts)):
        statements.append({"Sid": f"ListMounts{i}", "Effect": "Allow", "Action": "s3:ListBucket",
                           "Resource": f"arn:{partition}:s3:::{bucket}", "Condition": {"StringLike": {
                               "s3:prefix": [f"{g.prefix}*" for g in scope.mounts if g.bucket == bucket]}}})
    if writable := [g for g in scope.mounts if not g.read_only]:
        statements.append({"Sid": "WriteTheMounts", "Effect": "Allow", "Action": [
            "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
            "Resource": [f"{arn(g)}/{g.prefix}*" for g in writable]})
    return {"Version": "2012-10-17", "Statement": statements}


def _mint_s3(settings: Settings, scope: Scope, name: str) -> NodeCredentials:
    role = settings.node_role_arn
    if not role:
        raise NoCredentials(
            f"the checkpoint root {settings.checkpoint_uri} is in S3, and nodes get only credentials scoped to "
            "their own job, minted from a role the broker may assume: set SPOTBROKER_NODE_ROLE_ARN "
            "(see docs/skypilot.md, 'Storage credentials'); the broker never hands out its own keys")
    partition = role.split(":")[1] if role.count(":") >= 5 else "aws"
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        answer = _sts_client(boto3).assume_role(
            RoleArn=role, RoleSessionName=name, DurationSeconds=settings.node_credentials_seconds,
            Policy=json.dumps(s3_policy(scope, partition), separators=(",", ":")))
    except ClientError as exc:  # the error's code and message name no secret
        error = exc.response.get("Error", {})
        raise NoCredentials(f"could not mint the node's storage credentials (sts:AssumeRole on {role}): "
                            f"{error.get('Code')}: {error.get('Message')}") from None
    except BotoCoreError as exc:
        raise NoCredentials(f"could not mint the node's storage credentials (sts:AssumeRole on {role}): "
                            f"{type(exc).__name__}: {exc}") from None
    given = answer["Credentials"]
    expires = given["Expiration"]
    expires = expires.astimezone(UTC) if expires.tzinfo else expires.replace(tzinfo=UTC)
    credentials = {"access_key_id": given["AccessKeyId"], "secret_access_key": given["SecretAccessKey"],
                   "token": given["SessionToken"]}
    return NodeCredentials("s3", expires, scope.bucket, {**_s3_place(), **_other_buckets(scope)}, credentials)


def _other_buckets(scope: Scope) -> dict[str, str]:
    """The buckets besides the checkpoint root's that the credentials reach
    (file mounts'), in the document's options: the node's storage layer
    reaches them with these credentials too."""
    others = sorted({g.bucket for g in scope.mounts} - {scope.bucket})
    return {"buckets": ",".join(others)} if others else {}


_STS_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL",
            "AWS_ENDPOINT_URL_STS", "AWS_REGION", "AWS_DEFAULT_REGION")
_sts_clients: dict[tuple[str | None, ...], object] = {}
_sts_lock = threading.Lock()


def _sts_client(boto3):
    """The broker's own identity, from its standard AWS chain (AWS_ENDPOINT_URL
    included). One client per environment: making one costs tens of
    milliseconds of CPU, and a changed environment (keys rotated into it)
    gets a new one; credentials the chain refreshes itself (an instance
    profile) are refreshed by the client."""
    key = tuple(os.environ.get(name) for name in _STS_ENV)
    with _sts_lock:
        client = _sts_clients.get(key)
        if client is None:
            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
            client = _sts_clients[key] = boto3.session.Session().client("sts", region_name=region)
        return client


def _s3_place() -> dict[str, str]:
    """Where the node finds the bucket: the endpoint and region the broker's
    own storage uses (a MinIO or a local stand-in has to be the same one).
    Always a region: else the node's client would take the user's own."""
    out = {"region": os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        out["endpoint"] = endpoint
    return out


# --- GCS -----------------------------------------------------------------------------------------

GCS_RESOURCE = "//storage.googleapis.com/projects/_/buckets/{}"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
# What google.auth.downscoped.Credentials.refresh sends to Google's STS (RFC 8693).
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN = "urn:ietf:params:oauth:token-type:access_token"


def gcs_rules(scope: Scope) -> list:
    """The Credential Access Boundary: objectAdmin under the attempt's
    prefix; objectViewer under the job's (reading, and listing with a prefix
    inside it) and on the code object."""
    from google.auth import downscoped

    objects = f"projects/_/buckets/{scope.bucket}/objects/"
    resource = GCS_RESOURCE.format(scope.bucket)
    listing = "api.getAttribute('storage.googleapis.com/objectListPrefix', '')"
    rules = [
        downscoped.AccessBoundaryRule(resource, ["inRole:roles/storage.objectAdmin"], downscoped.AvailabilityCondition(
            f"resource.name.startsWith('{objects}{scope.write}')", title="write the attempt")),
        downscoped.AccessBoundaryRule(resource, ["inRole:roles/storage.objectViewer"], downscoped.AvailabilityCondition(
            f"resource.name.startsWith('{objects}{scope.read}') || {listing}.startsWith('{scope.read}')",
            title="read the job")),
    ]
    for grant in scope.mounts:  # the buckets its file mounts name (a boundary holds at most ten rules)
        mount_objects = f"projects/_/buckets/{grant.bucket}/objects/"
        role = "objectViewer" if grant.read_only else "objectAdmin"
        rules.append(downscoped.AccessBoundaryRule(
            GCS_RESOURCE.format(grant.bucket), [f"inRole:roles/storage.{role}"], downscoped.AvailabilityCondition(
                f"resource.name.startsWith('{mount_objects}{grant.prefix}') || "
                f"{listing}.startsWith('{grant.prefix}')", title="a file mount")))
    if scope.objects:  # one rule for them all: a boundary holds at most ten
        named = " || ".join(f"resource.name == '{objects}{key}'" for key in scope.objects)
        rules.append(downscoped.AccessBoundaryRule(
            resource, ["inRole:roles/storage.objectViewer"],
            downscoped.AvailabilityCondition(named, title="read the code")))
    return rules


def _mint_gcs(settings: Settings, scope: Scope) -> NodeCredentials:
    """A downscoped token: the broker's own credentials (its application
    default credentials) exchanged at Google's STS for a token that carries
    the boundary; it lasts as long as the source token (about an hour)."""
    if "'" in scope.write + scope.read + "".join(scope.objects) + scope.bucket \
            + "".join(g.bucket + g.prefix for g in scope.mounts):
        raise NoCredentials("a quote in a storage path cannot be put in an access boundary's condition")
    import google.auth
    from google.auth import downscoped
    from google.auth import exceptions as gexc
    from google.auth.transport.requests import Request
    from google.oauth2 import sts

    boundary = downscoped.CredentialAccessBoundary(rules=gcs_rules(scope))
    try:
        source, _ = google.auth.default(scopes=[CLOUD_PLATFORM])
        request = Request()
        source.refresh(request)
        now = datetime.now(UTC)
        # downscoped.Credentials does exactly this, but only against sts.googleapis.com.
        answer = sts.Client(settings.node_gcs_sts_url).exchange_token(
            request=request, grant_type=TOKEN_EXCHANGE, subject_token=source.token, subject_token_type=ACCESS_TOKEN,
            requested_token_type=ACCESS_TOKEN, additional_options=boundary.to_json())
    except gexc.GoogleAuthError as exc:
        raise NoCredentials(f"could not mint the node's storage credentials (a downscoped token): "
                            f"{type(exc).__name__}: {exc}") from None
    if answer.get("expires_in"):
        expires = now + timedelta(seconds=float(answer["expires_in"]))
    else:
        expires = source.expiry.replace(tzinfo=UTC) if source.expiry else now + timedelta(hours=1)
    # A private endpoint or a stand-in (obstore's GOOGLE_BASE_URL setting): the node's must be the same.
    place = {"endpoint": os.environ["GOOGLE_BASE_URL"]} if os.environ.get("GOOGLE_BASE_URL") else {}
    place.update(_other_buckets(scope))
    return NodeCredentials("gs", expires, scope.bucket, place, {"token": answer["access_token"]})
