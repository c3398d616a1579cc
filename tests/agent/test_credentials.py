"""The agent's side of a node's storage credentials: the file it keeps for
the trainer, its renewals, and the checkpoint library reading the file again
when obstore's cached credentials near their end (against moto's S3 with IAM
enforced: signatures are checked, so the key in use is observable)."""
from __future__ import annotations

import json
import os
import stat
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from support.iamfixtures import aws_iam  # noqa: F401  (fixtures, found by name)

from spotbroker.agent import credentials, protocol
from spotbroker.agent.checkpoint.storage import Storage


def document(key: str, secret: str, in_seconds: float, token: str | None = None, bucket: str = "ckpt",
             endpoint: str | None = None) -> dict:
    creds = {"access_key_id": key, "secret_access_key": secret, **({"token": token} if token else {})}
    return {"provider": "s3", "expires_at": (datetime.now(UTC) + timedelta(seconds=in_seconds)).isoformat(),
            "bucket": bucket, "options": {"region": "us-east-1", **({"endpoint": endpoint} if endpoint else {})},
            "credentials": creds}


def launch_env(in_seconds: float = 3600) -> dict[str, str]:
    return {"PATH": "/bin", protocol.ENV_STORAGE_CREDENTIALS: json.dumps(
        document("ASIALAUNCH", "launch-secret", in_seconds, "tok"))}


def test_the_launchs_credentials_become_the_trainers_file(tmp_path):
    env = launch_env()
    keeper = credentials.CredentialsKeeper.start_for(tmp_path, env)
    path = tmp_path / protocol.CREDENTIALS_FILE
    assert env[protocol.ENV_STORAGE_CREDENTIALS_FILE] == str(path) == str(keeper.path)
    assert protocol.ENV_STORAGE_CREDENTIALS not in env  # the trainer's one source is the file, kept fresh
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    saved = json.loads(path.read_text())
    assert saved["credentials"] == {"access_key_id": "ASIALAUNCH", "secret_access_key": "launch-secret",
                                    "token": "tok"}
    assert 3000 - 600 < keeper.due_in() <= 3600 - 600  # renewed ten minutes before the end
    assert credentials.CredentialsKeeper.start_for(tmp_path, {"PATH": "/bin"}) is None  # a file:// root: none
    assert credentials.CredentialsKeeper.start_for(None, launch_env()) is None  # no control dir: nothing to keep


def test_the_keeper_renews_before_the_end_retries_and_stops_when_the_attempt_is_gone(tmp_path):
    keeper = credentials.CredentialsKeeper(tmp_path / "c.json", document("K0", "s0", 5), lead=600, retry=0.05)
    answers = [RuntimeError("broker down"), document("K1", "s1", 3600), LookupError("gone")]
    calls = []

    def fetch():
        calls.append(datetime.now(UTC))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        keeper.lead = 3600  # the next renewal is due at once: the broker then says the attempt is gone
        return answer

    stop = threading.Event()
    runner = threading.Thread(target=keeper.run, args=(fetch, stop), kwargs={"gone": (LookupError,)})
    runner.start()
    runner.join(timeout=10)
    assert not runner.is_alive() and len(calls) == 3  # failed, renewed, gone
    assert json.loads(keeper.path.read_text())["credentials"]["access_key_id"] == "K1"


def test_the_library_reads_the_file_again_when_its_credentials_near_their_end(aws_iam, tmp_path,  # noqa: F811
                                                                            monkeypatch):
    path = tmp_path / protocol.CREDENTIALS_FILE
    monkeypatch.setenv(protocol.ENV_STORAGE_CREDENTIALS_FILE, str(path))
    root = f"s3://{aws_iam.bucket}/job"

    def at_moto(key: str, secret: str, in_seconds: float) -> dict:  # the broker's keys stand in for a session's
        return document(key, secret, in_seconds, bucket=aws_iam.bucket, endpoint=aws_iam.endpoint)

    # Credentials ending within obstore's five-minute margin: asked for again on the next
    # request (obstore shares one answer among requests less than about half a second apart).
    credentials.write(path, at_moto(aws_iam.broker_key, aws_iam.broker_secret, 120))
    near = Storage(root)
    near.put("a", b"1")
    credentials.write(path, at_moto("AKIAREVOKED000000000", "wrong", 120))
    time.sleep(1)
    with pytest.raises(Exception, match="(?i)access ?key|denied|forbidden|403"):
        near.put("b", b"2")  # the file was read again: its (bad) key was used
    credentials.write(path, at_moto(aws_iam.broker_key, aws_iam.broker_secret, 120))
    time.sleep(1)
    near.put("c", b"3")  # and the renewed one is picked up without a new Storage

    # Credentials good for an hour are kept by obstore: the file is not read for each request.
    credentials.write(path, at_moto(aws_iam.broker_key, aws_iam.broker_secret, 3600))
    far = Storage(root)
    far.put("d", b"4")
    credentials.write(path, at_moto("AKIAREVOKED000000000", "wrong", 3600))
    time.sleep(1)
    far.put("e", b"5")
    assert [o.key for o in far.list()] == ["a", "c", "d", "e"]


def test_a_document_that_is_not_one_is_refused(tmp_path, monkeypatch):
    with pytest.raises(credentials.CredentialsError):
        credentials.parse({"provider": "s3", "credentials": {}})
    with pytest.raises(credentials.CredentialsError, match="not JSON"):
        credentials.from_env({protocol.ENV_STORAGE_CREDENTIALS: "AKIA..."})
    with pytest.raises(credentials.CredentialsError, match="bucket"):
        credentials.from_env({protocol.ENV_STORAGE_CREDENTIALS: json.dumps(
            {k: v for k, v in document("K", "S", 60).items() if k != "bucket"})})
    path = tmp_path / "c.json"
    credentials.write(path, document("K", "S", 60))
    monkeypatch.setenv(protocol.ENV_STORAGE_CREDENTIALS_FILE, str(path))
    with pytest.raises(credentials.CredentialsError, match="not gs"):
        credentials.NodeCredentials("gs")()
    with pytest.raises(credentials.CredentialsError, match="no token for"):
        credentials.NodeCredentials("s3", "root/t/1/")()


def test_the_held_credentials_are_for_the_checkpoint_bucket_only(tmp_path, monkeypatch):
    """Any other bucket (a dataset the user reads with their own keys) is the standard environment's."""
    monkeypatch.delenv(protocol.ENV_STORAGE_CREDENTIALS_FILE, raising=False)
    monkeypatch.setenv(protocol.ENV_STORAGE_CREDENTIALS, launch_env()[protocol.ENV_STORAGE_CREDENTIALS])
    assert credentials.node_store("s3", "ckpt").options == {"region": "us-east-1"}  # before the agent: the variable
    assert credentials.NodeCredentials("s3")()["access_key_id"] == "ASIALAUNCH"
    assert credentials.node_store("s3", "datasets") is None and credentials.node_store("gs", "ckpt") is None
    path = tmp_path / protocol.CREDENTIALS_FILE
    credentials.write(path, document("ASIAFRESH", "s", 3600, "t"))
    monkeypatch.setenv(protocol.ENV_STORAGE_CREDENTIALS_FILE, str(path))  # the agent's file wins
    assert credentials.NodeCredentials("s3")()["access_key_id"] == "ASIAFRESH"


def test_the_checkpoint_bucket_is_where_the_broker_said_whatever_the_users_endpoint(monkeypatch):
    """A user's AWS_ENDPOINT_URL (their dataset in R2 or MinIO) is for their buckets, not the checkpoints'."""
    monkeypatch.delenv(protocol.ENV_STORAGE_CREDENTIALS_FILE, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://data.r2.example")
    given = {**document("ASIAX", "s", 3600, "t"), "options": {"region": "eu-west-1"}}  # real S3: no endpoint given
    monkeypatch.setenv(protocol.ENV_STORAGE_CREDENTIALS, json.dumps(given))
    assert Storage("s3://ckpt/root")._store.config["endpoint"] == "https://s3.eu-west-1.amazonaws.com"
    assert Storage("s3://datasets/train")._store.config["endpoint"] == "https://data.r2.example"
    monkeypatch.setenv("GOOGLE_BASE_URL", "https://gcs.data.example")  # the same for GCS
    monkeypatch.setenv(protocol.ENV_STORAGE_CREDENTIALS, json.dumps({**given, "provider": "gs", "options": {}}))
    assert Storage("gs://ckpt/root")._store.config["base_url"] == "https://storage.googleapis.com"
