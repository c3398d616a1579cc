"""The local node (root) reads the storage credentials its agent kept fresh
from the job's control directory, which the job's uid can write: it reads
no link, nothing but a regular file, and no more than a credentials
document's worth; otherwise the launch's own document serves. A link to
/dev/zero planted there would have taken the host's memory when the node
saved the job's bucket, a FIFO would have held the node forever."""
from __future__ import annotations

import json
import os
import threading

import pytest

from spotbroker.agent import credentials, protocol
from spotbroker.broker.launch import local_mounts


def document(bucket: str) -> str:
    return json.dumps({"provider": "aws", "expires_at": "2030-01-01T00:00:00+00:00", "bucket": bucket,
                       "credentials": {"aws_access_key_id": "AKIA", "aws_secret_access_key": "s"}})


@pytest.fixture
def node(tmp_path, monkeypatch):
    for name in (protocol.ENV_STORAGE_CREDENTIALS, protocol.ENV_STORAGE_CREDENTIALS_FILE):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "agent" / "control-1").mkdir(parents=True)
    return tmp_path


def held_within(seconds: float) -> dict | None:
    """What a checkpoint store would read now (`credentials.held`), or a failure if it blocks."""
    found: list = []
    reader = threading.Thread(target=lambda: found.append(credentials.held()), daemon=True)
    reader.start()
    reader.join(seconds)
    assert not reader.is_alive(), "reading the node's credentials blocked"
    return found[0]


def test_the_agents_kept_document_serves_when_it_is_a_file(node):
    credentials.write(node / "agent" / "control-1" / protocol.CREDENTIALS_FILE, json.loads(document("renewed")))
    local_mounts._credentials({protocol.ENV_STORAGE_CREDENTIALS: document("launch")}, node)
    try:
        assert held_within(5)["bucket"] == "renewed"
    finally:
        local_mounts._forget_credentials()


@pytest.mark.parametrize("planted", ["fifo", "link to a fifo", "link to a file", "too big"])
def test_what_the_job_planted_instead_is_not_read(node, tmp_path_factory, planted):
    kept = node / "agent" / "control-1" / protocol.CREDENTIALS_FILE
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    if planted == "fifo":
        os.mkfifo(kept)
    elif planted == "link to a fifo":
        os.mkfifo(elsewhere / "fifo")
        kept.symlink_to(elsewhere / "fifo")
    elif planted == "link to a file":  # a file of root's the job could not read itself
        (elsewhere / "root.json").write_text(document("roots"))
        kept.symlink_to(elsewhere / "root.json")
    else:
        kept.write_text(document("padded") + " " * (1 << 20))
    local_mounts._credentials({protocol.ENV_STORAGE_CREDENTIALS: document("launch")}, node)
    try:
        assert held_within(5)["bucket"] == "launch"
    finally:
        local_mounts._forget_credentials()
