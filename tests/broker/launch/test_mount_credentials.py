"""A node's credentials reach the buckets its file mounts name, as the
admin listed them, and nothing more: against moto's S3 and STS with IAM
enforced, both ways `test_storage_credentials.py` enforces a scope (the
broker's session policy narrowing a wide role; moto judging the broker's
document itself), through the checkpoint library's real `Storage`.
"""
from __future__ import annotations

import json

import obstore
import pytest
from support.iamfixtures import (  # noqa: F401  (fixtures, found by name)
    as_broker,
    aws_iam,
    iam_enforced,
    make_world,
    session_policies_enforced,
)
from support.s3fixtures import moto_endpoint  # noqa: F401

from spotbroker.agent import credentials as node_credentials
from spotbroker.agent import protocol
from spotbroker.agent.checkpoint.storage import Storage
from spotbroker.agent.mounts import Mount
from spotbroker.broker.jobs import mounts
from spotbroker.broker.jobs.buckets import Allowed
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.launch import storage_credentials as sc
from spotbroker.broker.settings import Settings

TEAM, JOB, ATTEMPT = "vision", 41, 702


def settings_for(world, tmp_path) -> Settings:
    return Settings(data_dir=tmp_path, checkpoint_root=f"s3://{world.bucket}/root", node_role_arn=world.role_arn,
                    _env_file=None)


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
    return False


def job_mounts(bucket: str, tmp_path) -> tuple[Mount, ...]:
    """A task file's mounts, resolved as a launch resolves them, with the team's list as the admin set it."""
    spec = JobSpec.model_validate({"run": "x", "file_mounts": {
        "/data": {"source": f"s3://{bucket}/datasets/imagenet", "mode": "COPY"},
        "/out": f"s3://{bucket}/outputs/{TEAM}",
        "/checkpoint": {"name": "my-ckpts"}}})
    allow = [Allowed(f"s3://{bucket}/datasets/", read_only=True), Allowed(f"s3://{bucket}/outputs/", False)]
    settings = settings_for_bucket(bucket, tmp_path)
    assert mounts.mount_errors(settings, TEAM, spec, allow) == []
    return tuple(mounts.resolved(settings, TEAM, spec, allow))


def settings_for_bucket(bucket, tmp_path):
    return Settings(data_dir=tmp_path, checkpoint_root=f"s3://{bucket}/root", _env_file=None)


def the_scope(bucket: str, tmp_path) -> sc.Scope:
    return sc.scope(f"s3://{bucket}/root", TEAM, JOB, ATTEMPT, (), job_mounts(bucket, tmp_path))


@pytest.fixture(params=["session", "role"])
def world(request, moto_endpoint, monkeypatch, tmp_path):  # noqa: F811
    if request.param == "session":
        request.getfixturevalue("session_policies_enforced")
        return request.getfixturevalue("aws_iam")
    world = make_world(moto_endpoint, role_policy=lambda bucket: sc.s3_policy(the_scope(bucket, tmp_path)))
    as_broker(world, monkeypatch)
    request.getfixturevalue("iam_enforced")
    return world


def test_a_jobs_credentials_read_its_mounts_write_only_the_writable_and_touch_nothing_else(
        world, tmp_path, monkeypatch):
    s3 = world.client("s3")
    for key in ("datasets/imagenet/train/0.tar", "datasets/private/labels.csv", "outputs/other-team/x",
                f"root/{TEAM}/buckets/my-ckpts/step-1", f"root/{TEAM}/buckets/theirs/step-1", "private/key"):
        s3.put_object(Bucket=world.bucket, Key=key, Body=b"data")
    minted = sc.mint(settings_for(world, tmp_path), the_scope(world.bucket, tmp_path), "sb-vision-j41-a702")
    as_node(minted, tmp_path, monkeypatch)
    data = Storage(f"s3://{world.bucket}/datasets/imagenet")
    out = Storage(f"s3://{world.bucket}/outputs/{TEAM}")
    named = Storage(f"s3://{world.bucket}/root/{TEAM}/buckets/my-ckpts")

    # A read-only listed prefix: read, never written.
    assert data.get("train/0.tar") == b"data"
    assert refused(lambda: data.put("train/1.tar", b"evil"))
    # A writable listed prefix and the team's bucket by name: read and written.
    out.put("run-1/metrics.json", b"{}")
    assert out.get("run-1/metrics.json") == b"{}"
    named.put("step-2", b"new")
    assert named.get("step-1") == b"data" and named.get("step-2") == b"new"
    # Anything else: another listed bucket's prefix outside the mount, another bucket by name, the rest.
    assert refused(lambda: Storage(f"s3://{world.bucket}/datasets/private").get("labels.csv"))
    assert refused(lambda: Storage(f"s3://{world.bucket}/outputs/other-team").get("x"))
    assert refused(lambda: Storage(f"s3://{world.bucket}/outputs/other-team").put("x", b"evil"))
    assert refused(lambda: Storage(f"s3://{world.bucket}/root/{TEAM}/buckets/theirs").get("step-1"))
    assert refused(lambda: Storage(f"s3://{world.bucket}/private").get("key"))
    assert s3.get_object(Bucket=world.bucket, Key="outputs/other-team/x")["Body"].read() == b"data"


def test_a_mount_outside_the_list_is_refused_naming_the_teams_prefixes(tmp_path):
    spec = JobSpec.model_validate({"run": "x", "file_mounts": {"/data": "s3://my-datasets/imagenet",
                                                                "/ok": {"source": "s3://shared/ok/x"}}})
    settings = settings_for_bucket("ckpt", tmp_path)
    errors = mounts.mount_errors(settings, TEAM, spec, [Allowed("s3://shared/ok/", True)])
    assert [e["field"] for e in errors] == ["file_mounts./data"]
    assert "s3://ckpt/root/vision/" in errors[0]["message"] and "s3://shared/ok/ (read only)" in errors[0]["message"]


def test_on_gcs_a_downscoped_token_reads_a_read_only_mount_writes_a_writable_one_and_nothing_else(
        tmp_path, monkeypatch):
    """The same, on a gs:// root: the access boundary the broker asks Google's
    STS for (a local fake that enforces it: tests/support/gcsfake.py)."""
    pytest.importorskip("google.auth", reason="google-auth comes with the broker extra")
    from support.gcsfake import GoogleFake

    fake = GoogleFake().start()
    try:
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", fake.adc_file(tmp_path / "adc.json"))
        monkeypatch.setenv("GOOGLE_BASE_URL", fake.url)
        for key in ("datasets/imagenet/0.tar", "datasets/private/labels.csv", f"outputs/{TEAM}/x", "outputs/other/x"):
            fake.objects[("ckpt", key)] = b"data"
        settings = Settings(data_dir=tmp_path, checkpoint_root="gs://ckpt/root",
                            node_gcs_sts_url=f"{fake.url}/v1/token", _env_file=None)
        spec = JobSpec.model_validate({"run": "x", "file_mounts": {
            "/data": "gs://ckpt/datasets/imagenet", "/out": {"source": f"gs://ckpt/outputs/{TEAM}"}}})
        allow = [Allowed("gs://ckpt/datasets/", read_only=True), Allowed("gs://ckpt/outputs/", read_only=False)]
        placed = tuple(mounts.resolved(settings, TEAM, spec, allow))
        minted = sc.mint(settings, sc.scope(settings.checkpoint_uri, TEAM, JOB, ATTEMPT, (), placed), "x")
        as_node(minted, tmp_path, monkeypatch)
        monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
        data, out = Storage("gs://ckpt/datasets/imagenet"), Storage(f"gs://ckpt/outputs/{TEAM}")
        assert data.get("0.tar") == b"data"
        out.put("y", b"new")
        assert out.get("y") == b"new"
        assert gcs_refused(lambda: data.put("1.tar", b"evil"))
        assert gcs_refused(lambda: Storage("gs://ckpt/datasets/private").get("labels.csv"))
        assert gcs_refused(lambda: Storage("gs://ckpt/outputs/other").put("x", b"evil"))
        assert fake.objects[("ckpt", "outputs/other/x")] == b"data"
    finally:
        fake.stop()


def gcs_refused(call) -> bool:
    try:
        call()
    except obstore.exceptions.PermissionDeniedError:
        return True
    except obstore.exceptions.GenericError as exc:  # obstore does not classify every GCS 403
        return "403 Forbidden" in str(exc)
    return False


def test_on_azure_a_directory_sas_per_mount_read_only_where_listed_so(tmp_path, monkeypatch):
    """The same, on an az:// root: one directory SAS per mount, in the root's
    container (a local fake that judges each SAS: tests/support/azurefake.py)."""
    pytest.importorskip("azure.storage.blob", reason="azure-storage-blob comes with the broker extra")
    from support.azurefake import AzureFake

    env = ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY",
           "AZURE_STORAGE_ENDPOINT", "AZURE_STORAGE_USE_EMULATOR")
    fake = AzureFake().start()
    try:
        for name in env:
            monkeypatch.delenv(name, raising=False)
        for name, value in {"AZURE_STORAGE_ACCOUNT_NAME": fake.account, "AZURE_STORAGE_ACCOUNT_KEY": fake.key,
                            "AZURE_STORAGE_ENDPOINT": fake.endpoint}.items():
            monkeypatch.setenv(name, value)
        for key in ("datasets/imagenet/0.tar", "datasets/private/labels.csv", "outputs/other/x"):
            fake.objects[("ckpt", key)] = b"data"
        settings = Settings(data_dir=tmp_path, checkpoint_root="az://ckpt/root", _env_file=None)
        spec = JobSpec.model_validate({"run": "x", "file_mounts": {
            "/data": "az://ckpt/datasets/imagenet", "/out": {"source": f"az://ckpt/outputs/{TEAM}"}}})
        allow = [Allowed("az://ckpt/datasets/", read_only=True), Allowed("az://ckpt/outputs/", read_only=False)]
        placed = tuple(mounts.resolved(settings, TEAM, spec, allow))
        with pytest.raises(sc.NoCredentials, match="container"):  # another container: no directory SAS there
            other = tuple(mounts.resolved(settings, TEAM, JobSpec.model_validate(
                {"run": "x", "file_mounts": {"/d": "az://elsewhere/d"}}), [Allowed("az://elsewhere/", True)]))
            sc.mint(settings, sc.scope(settings.checkpoint_uri, TEAM, JOB, ATTEMPT, (), other), "x")
        minted = sc.mint(settings, sc.scope(settings.checkpoint_uri, TEAM, JOB, ATTEMPT, (), placed), "x")
        as_node(minted, tmp_path, monkeypatch)
        for name in env:
            monkeypatch.delenv(name, raising=False)
        data, out = Storage("az://ckpt/datasets/imagenet"), Storage(f"az://ckpt/outputs/{TEAM}")
        assert data.get("0.tar") == b"data"
        out.put("y", b"new")
        assert out.get("y") == b"new"
        assert gcs_refused(lambda: data.put("1.tar", b"evil"))
        assert gcs_refused(lambda: Storage("az://ckpt/datasets/private").get("labels.csv"))
        assert gcs_refused(lambda: Storage("az://ckpt/outputs/other").put("x", b"evil"))
        assert fake.objects[("ckpt", "outputs/other/x")] == b"data"
    finally:
        fake.stop()


def test_on_azure_a_mount_in_another_container_is_refused_at_submission(tmp_path):
    settings = Settings(data_dir=tmp_path, checkpoint_root="az://ckpt/root", _env_file=None)
    spec = JobSpec.model_validate({"run": "x", "file_mounts": {"/d": "az://elsewhere/d", "/e": "az://ckpt/data/e"}})
    errors = mounts.mount_errors(settings, TEAM, spec, [Allowed("az://elsewhere/", True), Allowed("az://ckpt/data/",
                                                                                                  True)])
    assert [(e["field"], "container" in e["message"]) for e in errors] == [("file_mounts./d", True)]


def test_a_session_policy_with_eight_mounts_stays_within_what_sts_takes():
    grants = tuple(sc.Grant(f"datasets-{i % 2}", f"team/vision/set-{i}/", read_only=i % 3 == 0) for i in range(8))
    scope = sc.scope("s3://ckpt/root", TEAM, JOB, ATTEMPT, ("s3://ckpt/root/vision/uploads/" + "c" * 64 + ".tar.gz",))
    policy = sc.s3_policy(sc.Scope(scope.scheme, scope.bucket, scope.write, scope.read, scope.objects, grants))
    assert len(json.dumps(policy, separators=(",", ":"))) < 2048  # STS's limit on the plain text
