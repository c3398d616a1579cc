"""agent/checkpoint/storage.py against moto's S3 server (real HTTP) and the local disk."""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from spotbroker.agent.checkpoint import localfile
from spotbroker.agent.checkpoint.storage import Storage, join_uri


@pytest.fixture(params=["file", "s3"])
def root_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same tests on a local directory and on an S3 bucket."""
    if request.param == "file":
        return f"file://{tmp_path}/store"
    return request.getfixturevalue("s3_uri") + "/some/prefix"


def test_round_trip(root_uri: str, tmp_path: Path) -> None:
    store = Storage(root_uri)
    assert store.list() == [] and store.head("a") is None and not store.exists("a")

    store.put("a/one.bin", b"hello world")
    payload = os.urandom(3 * 1024 * 1024 + 17)
    store.put("a/b/two.bin", payload)

    assert store.get("a/one.bin") == b"hello world"
    assert store.get("a/one.bin", 6, 11) == b"world"
    assert store.get("a/one.bin", start=6) == b"world"
    assert store.size("a/b/two.bin") == len(payload)
    assert [(o.key, o.size) for o in store.list()] == [("a/b/two.bin", len(payload)), ("a/one.bin", 11)]
    # Prefixes are whole path segments.
    assert [o.key for o in store.list("a/b")] == ["a/b/two.bin"]
    assert store.list("a/b/tw") == []

    window = bytearray(1024 * 1024)
    store.get_into("a/b/two.bin", window, start=1000)
    assert bytes(window) == payload[1000:1000 + len(window)]

    downloaded = tmp_path / "down" / "two.bin"
    assert store.get_file("a/b/two.bin", downloaded) == len(payload)
    assert downloaded.read_bytes() == payload
    store.put_file("c/copy.bin", downloaded)
    assert store.get("c/copy.bin") == payload

    store.put("a/one.bin", b"replaced")  # overwrite
    assert store.get("a/one.bin") == b"replaced"
    assert store.url("a/one.bin") == join_uri(root_uri, "a/one.bin")
    assert store.child("a").get("one.bin") == b"replaced"

    store.delete_many(["a/one.bin", "never/was"])
    assert not store.exists("a/one.bin")
    assert store.delete_prefix("a") == 1
    assert [o.key for o in store.list()] == ["c/copy.bin"]


def test_missing_objects(root_uri: str) -> None:
    store = Storage(root_uri)
    with pytest.raises(FileNotFoundError):
        store.get("nope")
    with pytest.raises(FileNotFoundError):
        store.size("nope")
    store.delete("nope")  # deleting what is not there is fine


def test_large_objects_go_in_parallel_parts(s3_uri: str, tmp_path: Path) -> None:
    # Thresholds shrunk so that a 12 MiB object takes the multipart path
    # (S3 parts are at least 5 MiB, but the last).
    store = Storage(s3_uri + "/big", multipart_threshold=6 * 1024 * 1024, part_size=5 * 1024 * 1024)
    payload = os.urandom(12 * 1024 * 1024 + 3)
    store.put("x.bin", payload)
    assert store.get("x.bin") == payload
    source = tmp_path / "src.bin"
    source.write_bytes(payload)
    store.put_file("y.bin", source)
    buffer = bytearray(len(payload))
    store.get_into("y.bin", buffer)
    assert buffer == payload


def test_endpoint_comes_from_the_standard_environment(s3_uri: str, moto_endpoint: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    Storage(s3_uri).put("k", b"v")
    # The service-specific variable wins over the general one.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    assert Storage(s3_uri).get("k") == b"v"


def test_gcs_and_azure_uris_root_their_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    for uri in ("gs://bucket/team/job", "az://container/team/job"):
        store = Storage(uri)
        assert store.url("step-1/MANIFEST.json") == f"{uri}/step-1/MANIFEST.json"
        assert store._store.prefix == "team/job"  # keys land under the URI's path, not the bucket's root


def test_bad_uris() -> None:
    with pytest.raises(ValueError, match="unsupported"):
        Storage("ftp://host/x")
    with pytest.raises(ValueError, match="bucket"):
        Storage("s3:///no-bucket")
    assert Storage("/tmp/x/").uri == "file:///tmp/x"


_WRITER = r"""
import sys
from spotbroker.agent.checkpoint.storage import Storage
store = Storage(sys.argv[1])
size = int(sys.argv[2])
print("ready", flush=True)
i = 0
while True:
    i = (i + 1) % 250 or 1
    store.put("obj.bin", bytes([i]) * size)   # every version is one repeated byte
"""


def test_a_killed_local_writer_never_leaves_a_half_object(tmp_path: Path) -> None:
    """SIGKILL a process that keeps rewriting one object: what is left is whole."""
    rng = random.Random(1234)
    size = 8 * 1024 * 1024
    uri = f"file://{tmp_path}/s"
    Storage(uri).put("obj.bin", bytes([0]) * size)
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, uri, str(size)], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.05, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        store = Storage(uri)
        # The listing shows one object, never a staging file.
        assert [o.key for o in store.list()] == ["obj.bin"]
        data = store.get("obj.bin")
        assert len(data) == size and data == data[:1] * size
    # Deleting the prefix also sweeps the dead writers' staging files.
    assert Storage(uri).delete_prefix("") == 1
    assert not any(files for _, _, files in os.walk(tmp_path / "s"))


# --------------------------------------------------------------------------
# Large local objects: written O_DIRECT through the bounce buffer, hashed on the way


def _pattern(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


@pytest.mark.parametrize("sizes", [
    [localfile.DIRECT_THRESHOLD],                                     # whole blocks only
    [localfile.DIRECT_CHUNK * 2 + 12345],                              # an unaligned tail
    [100, localfile.DIRECT_CHUNK - 7, 4096, 3 * localfile.DIRECT_CHUNK + 1, 1],  # segments across chunks
])
def test_large_local_puts_are_exact_and_hashed_while_written(tmp_path: Path, sizes: list[int]) -> None:
    store = Storage(f"file://{tmp_path}/store")
    segments = [_pattern(n, i) for i, n in enumerate(sizes)]
    digest = hashlib.sha256()
    store.put("big.bin", [memoryview(s) for s in segments], digest=digest)
    whole = b"".join(segments)
    assert (tmp_path / "store" / "big.bin").read_bytes() == whole
    assert digest.hexdigest() == hashlib.sha256(whole).hexdigest()
    assert [p.name for p in (tmp_path / "store").iterdir()] == ["big.bin"]  # no staging file left


def test_small_puts_are_hashed_too(root_uri: str) -> None:
    store = Storage(root_uri)
    digest = hashlib.sha256()
    store.put("small.bin", [b"abc", memoryview(b"def")], digest=digest)
    assert store.get("small.bin") == b"abcdef"
    assert digest.hexdigest() == hashlib.sha256(b"abcdef").hexdigest()


def test_a_refused_direct_write_falls_back_to_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system that accepts O_DIRECT at open() but refuses the writes
    (stricter alignment) still gets the object, whole and right."""
    real_write = os.write
    refused = []

    def picky_write(fd: int, data: Any) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & localfile.O_DIRECT:
            refused.append(len(data))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(localfile.os, "write", picky_write)
    payload = _pattern(localfile.DIRECT_CHUNK + 5000, 3)
    digest = hashlib.sha256()
    Storage(f"file://{tmp_path}/s").put("x.bin", payload, digest=digest)
    assert refused  # the direct path was tried first
    assert (tmp_path / "s" / "x.bin").read_bytes() == payload
    assert digest.hexdigest() == hashlib.sha256(payload).hexdigest()


def test_no_o_direct_at_open_means_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def no_direct(path: Any, flags: int, *args: Any) -> int:
        if flags & localfile.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")  # tmpfs says this
        return real_open(path, flags, *args)

    monkeypatch.setattr(localfile.os, "open", no_direct)
    payload = _pattern(localfile.DIRECT_THRESHOLD + 1, 4)
    Storage(f"file://{tmp_path}/s").put("x.bin", payload)
    assert (tmp_path / "s" / "x.bin").read_bytes() == payload
