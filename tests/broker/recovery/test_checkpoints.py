"""The broker's checkpoint rules on every kind of root: which reported URIs
name an attempt's own place, and keep's read-back before it writes."""
from __future__ import annotations

import pytest
from support.s3fixtures import moto_endpoint, s3_uri  # noqa: F401  (fixtures, found by name)

from spotbroker.broker.checkpoints.uris import (
    BadCheckpointUri,
    CheckpointUnverified,
    accepted_uri,
    attempt_prefix,
    verify_and_keep,
)


@pytest.mark.parametrize("root, same, others", [
    ("s3://bucket/root", ["s3://bucket/root/t/1/2/step-000000000005", "s3a://bucket/root/t/1/2/step-000000000005",
                          "S3://bucket/root/t/1/2/step-000000000005/", "s3://bucket/root/t/1/2/step-00000000000%35"],
     ["s3://other/root/t/1/2/step-000000000005", "gs://bucket/root/t/1/2/step-000000000005",
      "s3://bucket/t/1/2/step-000000000005", "s3:///root/t/1/2/step-000000000005",
      "s3://bucket/root/t/1/3/step-000000000005", "s3://bucket/root/t/1/2/x/../step-000000000005"]),
    ("gs://b", ["gs://b/t/1/2/step-000000000005"], ["gs://b/t/1/2", "gs://b/t/1/2/step-5", "az://b/t/1/2/step-000000000005"]),
    ("/srv/ckpt", ["file:///srv/ckpt/t/1/2/step-000000000005", "/srv/ckpt/t/1/2/step-000000000005",
                   "file://localhost/srv/ckpt/t/1/2/step-000000000005"],
     ["file:///srv/ckpt/t/1/2/step-000000000005/..", "file:///srv/ckpt/t/1/2/../2/step-000000000005",
      "srv/ckpt/t/1/2/step-000000000005", "file://h/srv/ckpt/t/1/2/step-000000000005"]),
])
def test_only_the_attempts_own_place_for_the_step_is_accepted(root, same, others):
    prefix = attempt_prefix(root, "t", 1, 2)
    for uri in same:
        assert accepted_uri(uri, prefix, 5) == f"{prefix}/step-000000000005", uri
    for uri in others:
        with pytest.raises(BadCheckpointUri):
            accepted_uri(uri, prefix, 5)


def test_keep_reads_the_manifest_back_on_s3_before_writing(s3_uri):  # noqa: F811  (the fixture)
    torch = pytest.importorskip("torch")
    from spotbroker.agent.checkpoint import Checkpointer
    from spotbroker.agent.checkpoint.storage import Storage

    prefix = attempt_prefix(s3_uri, "t", 1, 2)
    info = Checkpointer(torch.nn.Linear(2, 2), uri=prefix, every_seconds=None, handle_signal=False).save(3)
    assert info.uri == f"{prefix}/step-000000000003"
    with pytest.raises(CheckpointUnverified, match="no manifest"):
        verify_and_keep(s3_uri, f"{prefix}/step-000000000004", 4)
    with pytest.raises(CheckpointUnverified, match="step 9"):
        verify_and_keep(s3_uri, info.uri, 9)  # the manifest of another step
    store = Storage(info.uri)
    assert not store.exists("KEEP")
    store.delete("state.pkl")
    with pytest.raises(CheckpointUnverified, match="state.pkl"):
        verify_and_keep(s3_uri, info.uri, 3)
    assert not store.exists("KEEP")
    info = Checkpointer(torch.nn.Linear(2, 2), uri=prefix, every_seconds=None, handle_signal=False).save(5)
    verify_and_keep(s3_uri, info.uri, 5)
    assert Storage(info.uri).exists("KEEP")


def test_keep_on_unreachable_storage_is_unverified_not_an_error(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    with pytest.raises(CheckpointUnverified, match="could not be read"):
        verify_and_keep("s3://b", "s3://b/t/1/2/step-000000000005", 5)
