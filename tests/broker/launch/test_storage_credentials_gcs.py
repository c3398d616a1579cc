"""A gs:// root: a node's downscoped token reaches its own job and nothing
else. The broker's own credentials (an authorized_user ADC file) are
refreshed and exchanged by google-auth's real code against a local fake of
Google's OAuth, STS and Cloud Storage XML endpoints (tests/support/gcsfake.py: it
checks the exchange's shape and enforces the token's access boundary); the
node side is the checkpoint library's `Storage` (obstore) reading the
agent's credentials file."""
from __future__ import annotations

import json
from urllib.parse import unquote

import obstore
import pytest
from support.gcsfake import SOURCE_TOKEN, GoogleFake

from spotbroker.agent import credentials as node_credentials
from spotbroker.agent import protocol
from spotbroker.agent.checkpoint.storage import Storage
from spotbroker.broker.launch import storage_credentials as sc
from spotbroker.broker.settings import Settings

pytest.importorskip("google.auth", reason="google-auth comes with the broker extra")
BUCKET, TEAM, OTHER_TEAM, JOB, OTHER_JOB, ATTEMPT, EARLIER = "ckpt", "vision", "speech", 41, 42, 702, 701
CODE = f"root/{TEAM}/uploads/{'a' * 64}.tar.gz"


@pytest.fixture
def google(tmp_path, monkeypatch):
    fake = GoogleFake().start()
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", fake.adc_file(tmp_path / "adc.json"))
    monkeypatch.setenv("GOOGLE_BASE_URL", fake.url)
    monkeypatch.delenv(protocol.ENV_STORAGE_CREDENTIALS_FILE, raising=False)
    for key in (f"root/{TEAM}/{JOB}/{EARLIER}/step-000000000010/MANIFEST.json", CODE,
                f"root/{TEAM}/{OTHER_JOB}/800/step-000000000001/MANIFEST.json",
                f"root/{OTHER_TEAM}/{JOB}/900/step-000000000001/MANIFEST.json",
                f"root/{TEAM}/uploads/{'b' * 64}.tar.gz", "secret_key"):
        fake.objects[(BUCKET, key)] = b"{}"
    yield fake
    fake.stop()


def mint(fake: GoogleFake, tmp_path) -> sc.NodeCredentials:
    settings = Settings(data_dir=tmp_path, checkpoint_root=f"gs://{BUCKET}/root",
                        node_gcs_sts_url=f"{fake.url}/v1/token", _env_file=None)
    scope = sc.scope(settings.checkpoint_uri, TEAM, JOB, ATTEMPT, (f"gs://{BUCKET}/{CODE}",))
    return sc.mint(settings, scope, sc.session_name(TEAM, JOB, ATTEMPT))


def refused(call) -> bool:
    try:
        call()
    except obstore.exceptions.PermissionDeniedError:
        return True
    except obstore.exceptions.GenericError as exc:  # obstore does not classify a GCS listing's 403
        if "403 Forbidden" in str(exc):
            return True
        raise AssertionError(f"expected a 403, got {exc}") from None
    except Exception as exc:
        raise AssertionError(f"expected a 403, got {type(exc).__name__}: {exc}") from None
    return False


def test_a_downscoped_token_reaches_the_job_and_nothing_else(google, tmp_path, monkeypatch):
    minted = mint(google, tmp_path)
    (exchange,) = google.exchanges  # google-auth's token exchange, checked by the fake
    rules = json.loads(unquote(exchange["options"]))["accessBoundary"]["accessBoundaryRules"]
    assert [r["availablePermissions"] for r in rules] == [["inRole:roles/storage.objectAdmin"],
                                                          ["inRole:roles/storage.objectViewer"],
                                                          ["inRole:roles/storage.objectViewer"]]
    assert minted.provider == "gs" and minted.credentials["token"] != SOURCE_TOKEN
    assert list(minted.env) == [protocol.ENV_STORAGE_CREDENTIALS]  # never GOOGLE_*: those stay the user's
    assert minted.bucket == BUCKET and minted.options == {"endpoint": google.url}
    assert SOURCE_TOKEN not in json.dumps(minted.document()) and SOURCE_TOKEN not in json.dumps(minted.env)

    # The node: the agent's file, none of the broker's credentials.
    path = tmp_path / protocol.CREDENTIALS_FILE
    node_credentials.write(path, minted.document())
    monkeypatch.setenv(protocol.ENV_STORAGE_CREDENTIALS_FILE, str(path))
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    root = f"gs://{BUCKET}/root"
    attempt, job = Storage(f"{root}/{TEAM}/{JOB}/{ATTEMPT}"), Storage(f"{root}/{TEAM}/{JOB}")
    attempt.put("step-000000000020/MANIFEST.json", b"{}")
    attempt.delete("step-000000000020/MANIFEST.json")
    attempt.put("step-000000000021/MANIFEST.json", b"{}")
    assert job.get(f"{EARLIER}/step-000000000010/MANIFEST.json") == b"{}"
    assert {o.key for o in job.list()} == {f"{EARLIER}/step-000000000010/MANIFEST.json",
                                           f"{ATTEMPT}/step-000000000021/MANIFEST.json"}
    assert Storage(f"{root}/{TEAM}/uploads").get(f"{'a' * 64}.tar.gz") == b"{}"

    assert refused(lambda: Storage(f"{root}/{TEAM}/{OTHER_JOB}/800").put("step-000000000002/x", b"evil"))
    assert refused(lambda: Storage(f"{root}/{OTHER_TEAM}/{JOB}/900").put("step-000000000002/x", b"evil"))
    assert refused(lambda: job.put(f"{EARLIER}/step-000000000010/MANIFEST.json", b"evil"))
    assert refused(lambda: Storage(f"{root}/{OTHER_TEAM}/{JOB}/900").get("step-000000000001/MANIFEST.json"))
    assert refused(lambda: Storage(f"{root}/{TEAM}/{OTHER_JOB}").list())
    assert refused(lambda: Storage(f"{root}/{TEAM}/uploads").get(f"{'b' * 64}.tar.gz"))
    assert refused(lambda: Storage(f"gs://{BUCKET}").get("secret_key"))
    assert google.objects[(BUCKET, f"root/{TEAM}/{JOB}/{EARLIER}/step-000000000010/MANIFEST.json")] == b"{}"


def test_before_the_agent_runs_the_launch_variables_alone_fetch_the_code(google, tmp_path, monkeypatch):
    """What a SkyPilot node's code fetch has: the launch's environment, no credentials file yet
    (and obstore's endpoint setting nowhere but in the document)."""
    minted = mint(google, tmp_path)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    monkeypatch.delenv("GOOGLE_BASE_URL")
    for name, value in minted.env.items():
        monkeypatch.setenv(name, value)
    assert Storage(f"gs://{BUCKET}/root/{TEAM}/uploads").get(f"{'a' * 64}.tar.gz") == b"{}"
    assert refused(lambda: Storage(f"gs://{BUCKET}/root/{TEAM}/uploads").get(f"{'b' * 64}.tar.gz"))


def test_a_refused_exchange_is_a_clear_launch_error(google, tmp_path):
    google.boundaries.clear()
    settings = Settings(data_dir=tmp_path, checkpoint_root=f"gs://{BUCKET}/root",
                        node_gcs_sts_url=f"{google.url}/v1/no-such-endpoint", _env_file=None)
    with pytest.raises(sc.NoCredentials, match="downscoped token") as err:
        sc.mint(settings, sc.scope(settings.checkpoint_uri, TEAM, JOB, ATTEMPT), "x")
    assert SOURCE_TOKEN not in str(err.value)


def test_every_upload_the_job_names_is_readable_through_one_rule(google, tmp_path, monkeypatch):
    """A job's workdir and its file mounts that are uploads: one rule, however many (a boundary holds ten)."""
    mount = f"root/{TEAM}/uploads/{'c' * 64}.tar.gz"
    google.objects[(BUCKET, mount)] = b"mount"
    settings = Settings(data_dir=tmp_path, checkpoint_root=f"gs://{BUCKET}/root",
                        node_gcs_sts_url=f"{google.url}/v1/token", _env_file=None)
    scope = sc.scope(settings.checkpoint_uri, TEAM, JOB, ATTEMPT, (f"gs://{BUCKET}/{CODE}", f"gs://{BUCKET}/{mount}"))
    minted = sc.mint(settings, scope, "x")
    assert len(json.loads(unquote(google.exchanges[-1]["options"]))["accessBoundary"]["accessBoundaryRules"]) == 3
    path = tmp_path / protocol.CREDENTIALS_FILE
    node_credentials.write(path, minted.document())
    monkeypatch.setenv(protocol.ENV_STORAGE_CREDENTIALS_FILE, str(path))
    uploads = Storage(f"gs://{BUCKET}/root/{TEAM}/uploads")
    assert uploads.get(f"{'a' * 64}.tar.gz") == b"{}" and uploads.get(f"{'c' * 64}.tar.gz") == b"mount"
    assert refused(lambda: uploads.get(f"{'b' * 64}.tar.gz"))
