"""An az:// root: a node's SAS tokens reach its own job and nothing else.

The broker mints with azure-storage-blob's SAS helpers and the account's
key; the node side is the checkpoint library's `Storage` (obstore) reading
the agent's credentials file, one store per SAS place.

Two servers judge them, over real HTTP:

* tests/support/azurefake.py, a Blob endpoint of an account with hierarchical
  namespace: it checks every SAS's signature with the account's key,
  derives a directory SAS's directory from ``sdd`` as Azure does (so a token
  is refused outside its directory), its expiry and its permissions, for
  puts, block uploads, reads, listings and batch deletes (its doc says what
  it does not judge);
* Azurite (Microsoft's emulator), which has no hierarchical namespace: it
  refuses every directory SAS, and judges the blob SAS of the job's code
  (signature and permission) as Azure does.
"""
from __future__ import annotations

import json
from urllib.parse import parse_qs

import obstore
import pytest
from support.azurefake import AzureFake
from support.coldfixtures import azurite_endpoint  # noqa: F401  (a fixture, found by name)

from spotbroker.agent import credentials as node_credentials
from spotbroker.agent import protocol
from spotbroker.agent.checkpoint.storage import Storage
from spotbroker.broker.launch import azure_sas
from spotbroker.broker.launch import storage_credentials as sc
from spotbroker.broker.settings import Settings

pytest.importorskip("azure.storage.blob", reason="azure-storage-blob comes with the broker extra")
CONTAINER, TEAM, OTHER_TEAM, JOB, OTHER_JOB, ATTEMPT, EARLIER = "ckpt", "vision", "speech", 41, 42, 702, 701
CODE = f"root/{TEAM}/uploads/{'a' * 64}.tar.gz"
OTHER_UPLOAD = f"root/{TEAM}/uploads/{'b' * 64}.tar.gz"
AZURE_ENV = ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY",
             "AZURE_STORAGE_ACCESS_KEY", "AZURE_STORAGE_MASTER_KEY", "AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT",
             "AZURE_STORAGE_USE_EMULATOR", "AZURITE_BLOB_STORAGE_URL")


@pytest.fixture
def azure(monkeypatch):
    fake = AzureFake().start()
    for name in AZURE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(protocol.ENV_STORAGE_CREDENTIALS_FILE, raising=False)
    for name, value in {"AZURE_STORAGE_ACCOUNT_NAME": fake.account, "AZURE_STORAGE_ACCOUNT_KEY": fake.key,
                        "AZURE_STORAGE_ENDPOINT": fake.endpoint}.items():
        monkeypatch.setenv(name, value)
    for key in (f"root/{TEAM}/{JOB}/{EARLIER}/step-000000000010/MANIFEST.json", CODE, OTHER_UPLOAD,
                f"root/{TEAM}/{OTHER_JOB}/800/step-000000000001/MANIFEST.json",
                f"root/{OTHER_TEAM}/{JOB}/900/step-000000000001/MANIFEST.json", "secret_key"):
        fake.objects[(CONTAINER, key)] = b"{}"
    yield fake
    fake.stop()


def mint(tmp_path, container: str = CONTAINER) -> sc.NodeCredentials:
    settings = Settings(data_dir=tmp_path, checkpoint_root=f"az://{container}/root", _env_file=None)
    scope = sc.scope(settings.checkpoint_uri, TEAM, JOB, ATTEMPT, (f"az://{container}/{CODE}",))
    return sc.mint(settings, scope, sc.session_name(TEAM, JOB, ATTEMPT))


def as_node(minted: sc.NodeCredentials, tmp_path, monkeypatch) -> None:
    """This process becomes the node's trainer: the agent's file, and nothing of the account."""
    path = tmp_path / protocol.CREDENTIALS_FILE
    node_credentials.write(path, minted.document())
    monkeypatch.setenv(protocol.ENV_STORAGE_CREDENTIALS_FILE, str(path))
    for name in AZURE_ENV:
        monkeypatch.delenv(name, raising=False)


def refused(call) -> bool:
    try:
        call()
    except obstore.exceptions.PermissionDeniedError:
        return True
    except obstore.exceptions.GenericError as exc:  # obstore does not classify a listing's or a batch's 403
        if "403" in str(exc) or "Authorization" in str(exc) or "AuthenticationFailed" in str(exc):
            return True
        raise AssertionError(f"expected a 403, got {exc}") from None
    except Exception as exc:
        raise AssertionError(f"expected a 403, got {type(exc).__name__}: {exc}") from None
    return False


def test_the_nodes_sas_tokens_reach_its_job_and_nothing_else(azure, tmp_path, monkeypatch):
    minted = mint(tmp_path)
    tokens = minted.document()["credentials"]
    assert set(tokens) == {f"root/{TEAM}/{JOB}/{ATTEMPT}/", f"root/{TEAM}/{JOB}/", CODE}
    assert [parse_qs(tokens[p])["sr"] for p in sorted(tokens)] == [["d"], ["d"], ["b"]]  # never a container SAS
    assert parse_qs(tokens[f"root/{TEAM}/{JOB}/"])["sp"] == ["rl"]
    assert azure.key not in json.dumps(minted.document()) and azure.key not in json.dumps(minted.env)
    assert minted.options == {"account": azure.account, "endpoint": azure.endpoint}
    as_node(minted, tmp_path, monkeypatch)
    root = f"az://{CONTAINER}/root"
    attempt, job = Storage(f"{root}/{TEAM}/{JOB}/{ATTEMPT}"), Storage(f"{root}/{TEAM}/{JOB}")

    # Allowed: write its attempt's directory (in blocks too), delete there (a batch), read and list the job's.
    attempt.put("step-000000000020/part-0.bin", b"x" * 1024)
    Storage(attempt.uri, multipart_threshold=5 << 20, part_size=5 << 20).put("step-000000000020/mp.bin",
                                                                            b"z" * (11 << 20))
    assert attempt.get("step-000000000020/mp.bin", start=(11 << 20) - 4) == b"zzzz"
    attempt.delete("step-000000000020/part-0.bin")
    attempt.put("step-000000000020/MANIFEST.json", b"{}")
    assert job.get(f"{EARLIER}/step-000000000010/MANIFEST.json") == b"{}"
    assert {o.key for o in job.list()} == {f"{EARLIER}/step-000000000010/MANIFEST.json",
                                           f"{ATTEMPT}/step-000000000020/mp.bin",
                                           f"{ATTEMPT}/step-000000000020/MANIFEST.json"}
    assert Storage(f"{root}/{TEAM}/uploads").get(f"{'a' * 64}.tar.gz") == b"{}"
    # The job's token wrote nothing, the attempt's read its own: each request went to its place's token.
    assert {(op, sr) for op, blob, sr in azure.requests if blob.startswith(f"root/{TEAM}/{JOB}/{EARLIER}/")} == \
        {("read", "d")}

    # Refused: another job's or team's directory, an earlier attempt's, another upload, the code, the root.
    assert refused(lambda: Storage(f"{root}/{TEAM}/{OTHER_JOB}/800").put("step-000000000002/x", b"evil"))
    assert refused(lambda: Storage(f"{root}/{OTHER_TEAM}/{JOB}/900").put("step-000000000002/x", b"evil"))
    assert refused(lambda: job.put(f"{EARLIER}/step-000000000010/MANIFEST.json", b"evil"))
    assert refused(lambda: job.delete(f"{EARLIER}/step-000000000010/MANIFEST.json"))
    assert refused(lambda: Storage(f"{root}/{OTHER_TEAM}/{JOB}/900").get("step-000000000001/MANIFEST.json"))
    assert refused(lambda: Storage(f"{root}/{TEAM}/{OTHER_JOB}").list())
    assert refused(lambda: Storage(f"{root}/{TEAM}").list())
    assert refused(lambda: Storage(f"{root}/{TEAM}/uploads").get(f"{'b' * 64}.tar.gz"))
    assert refused(lambda: Storage(f"{root}/{TEAM}/uploads").put(f"{'a' * 64}.tar.gz", b"evil"))
    assert refused(lambda: Storage(f"az://{CONTAINER}").get("secret_key"))
    assert azure.objects[(CONTAINER, f"root/{TEAM}/{JOB}/{EARLIER}/step-000000000010/MANIFEST.json")] == b"{}"
    assert azure.objects[(CONTAINER, CODE)] == b"{}"


def test_a_token_for_a_wider_place_would_be_caught(azure, tmp_path, monkeypatch):
    """The fake judges what it is given: the team's directory, signed by the account, reads another job."""
    from azure.storage.blob import generate_blob_sas

    minted = mint(tmp_path)
    wide = generate_blob_sas(azure.account, CONTAINER, f"root/{TEAM}", account_key=azure.key, permission="rl",
                             expiry=minted.expires_at, is_directory=True)
    widened = sc.NodeCredentials("az", minted.expires_at, CONTAINER, minted.options,
                                 {**minted.credentials, f"root/{TEAM}/": wide})
    as_node(widened, tmp_path, monkeypatch)
    assert Storage(f"az://{CONTAINER}/root/{TEAM}/{OTHER_JOB}/800").get("step-000000000001/MANIFEST.json") == b"{}"


def test_no_account_key_is_a_clear_launch_error(azure, tmp_path, monkeypatch):
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_KEY")
    with pytest.raises(sc.NoCredentials, match="AZURE_STORAGE_ACCOUNT_KEY"):
        mint(tmp_path)


def test_azurite_judges_the_code_blobs_sas_and_refuses_directory_ones(azurite_endpoint, tmp_path,  # noqa: F811
                                                                      monkeypatch):
    from azure.storage.blob import BlobServiceClient

    for name in AZURE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "true")
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", azurite_endpoint)
    container = f"sas-{tmp_path.name[-20:].lower().replace('_', '-')}".rstrip("-")
    service = BlobServiceClient(f"{azurite_endpoint}/{azure_sas.EMULATOR_ACCOUNT}", credential={
        "account_name": azure_sas.EMULATOR_ACCOUNT, "account_key": azure_sas.EMULATOR_KEY})
    service.create_container(container)
    for key in (CODE, OTHER_UPLOAD, f"root/{TEAM}/{JOB}/{EARLIER}/step-000000000010/MANIFEST.json"):
        service.get_blob_client(container, key).upload_blob(b"{}")
    minted = mint(tmp_path, container)
    assert minted.options["endpoint"] == f"{azurite_endpoint}/{azure_sas.EMULATOR_ACCOUNT}"
    as_node(minted, tmp_path, monkeypatch)
    uploads = Storage(f"az://{container}/root/{TEAM}/uploads")
    assert uploads.get(f"{'a' * 64}.tar.gz") == b"{}"  # its signature and read permission, judged by Azurite
    assert refused(lambda: uploads.get(f"{'b' * 64}.tar.gz"))  # signed for another blob
    assert refused(lambda: uploads.put(f"{'a' * 64}.tar.gz", b"evil"))  # read only
    # No hierarchical namespace: Azurite refuses a directory SAS even inside its directory (the fake's to judge).
    assert refused(lambda: Storage(f"az://{container}/root/{TEAM}/{JOB}").get(
        f"{EARLIER}/step-000000000010/MANIFEST.json"))
