"""Placing a job's file mounts on a node (agent/mounts.py), on real files."""
from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest
from support.helpers import tgz
from support.s3fixtures import moto_endpoint, s3_uri  # noqa: F401  (fixtures, found by name)

from spotbroker.agent.checkpoint.storage import Storage
from spotbroker.agent.code import CodeError
from spotbroker.agent.mounts import Mount, decode, encode, place, save, target


def stored(root: Path, archive: bytes) -> tuple[str, str]:
    sha = hashlib.sha256(archive).hexdigest()
    (root / f"{sha}.tar.gz").write_bytes(archive)
    return f"file://{root}/{sha}.tar.gz", sha


def one_file(name: str, data: bytes, mode: int = 0o600) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), mode
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.fixture
def node(tmp_path: Path) -> tuple[Path, Path, Path]:
    for name in ("store", "home", "fs"):
        (tmp_path / name).mkdir()
    return tmp_path / "store", tmp_path / "home", tmp_path / "fs"


def test_files_directories_and_buckets_are_placed_at_their_paths(node):
    store, home, fs = node
    key_uri, key_sha = stored(store, one_file("sky-key", b"the key"))
    cfg_uri, cfg_sha = stored(store, tgz(**{"a.toml": b"x=1", "sub/b.toml": b"y=2"}))
    bucket = store / "buckets" / "ckpt"
    mounts = [Mount("~/.ssh/id_rsa", "file", key_uri, key_sha), Mount("/etc/app", "dir", cfg_uri, cfg_sha),
              Mount("~/ckpt", "bucket", f"file://{bucket}", mode="MOUNT"),
              Mount("~/copy", "bucket", f"file://{bucket}", mode="COPY")]
    (home / "etc").mkdir()
    (fs / "etc" / "app").mkdir(parents=True)
    (fs / "etc" / "app" / "old").write_text("from an earlier placing")  # replaced, not merged
    assert decode(encode(mounts)) == mounts
    assert place(mounts, home, fs) == [home / ".ssh/id_rsa", fs / "etc/app", home / "ckpt", home / "copy"]
    assert (home / ".ssh" / "id_rsa").read_bytes() == b"the key"
    assert (home / ".ssh" / "id_rsa").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in (fs / "etc" / "app").rglob("*")) == ["a.toml", "b.toml", "sub"]
    (home / "ckpt" / "model").write_text("w")  # MOUNT: written through, into the bucket
    assert (bucket / "model").read_text() == "w" and (home / "ckpt").is_symlink()
    assert not (home / ".ssh" / ".id_rsa.mount").exists() and not list(home.glob(".code*"))


def test_what_is_no_single_file_or_no_mount_path_is_refused(node):
    store, home, fs = node
    uri, sha = stored(store, tgz(**{"a": b"1", "b": b"2"}))
    with pytest.raises(CodeError, match="one regular file"):
        place([Mount("~/key", "file", uri, sha)], home, fs)
    with pytest.raises(CodeError, match="sha256"):
        place([Mount("~/key", "dir", uri, "0" * 64)], home, fs)
    with pytest.raises(CodeError, match="not a path a mount may take"):
        target("~/.", home, fs)
    with pytest.raises(CodeError, match="not a path a mount may take"):
        place([Mount("~/.", "dir", uri, sha)], home, fs)
    assert (home.exists(), list(home.iterdir())) == (True, [])
    with pytest.raises(ValueError):
        Mount.parse({"path": "~/x", "kind": "dir", "uri": uri})  # an upload without its hash


def test_saving_reads_only_the_jobs_regular_files_and_follows_no_link(node, tmp_path, s3_uri):  # noqa: F811
    store, home, fs = node
    (tmp_path / "host-secret").write_text("of the host")
    bucket = tmp_path / "cloud"
    mount = Mount("~/ckpt", "bucket", f"file://{bucket}", mode="MOUNT")
    (home / "ckpt" / "d").mkdir(parents=True)
    (home / "ckpt" / "d" / "w.bin").write_text("weights")
    (home / "ckpt" / "link").symlink_to(tmp_path / "host-secret")
    (home / "ckpt" / "dirlink").symlink_to(tmp_path)
    # A file:// bucket is linked, never saved; as a cloud one (save's case) it is written back.
    assert save([mount], home, fs) == 0
    cloud = Mount("~/ckpt", "bucket", f"{s3_uri}/team/buckets/ckpt", mode="MOUNT")
    assert save([cloud], home, fs) == 1
    assert save([Mount("~/ckpt", "bucket", f"{s3_uri}/copy", mode="COPY"),
                 Mount("~/ckpt", "bucket", f"{s3_uri}/ro", mode="MOUNT", read_only=True)], home, fs) == 0
    assert save([cloud], home, fs, owner_uid=(home / "ckpt" / "d" / "w.bin").stat().st_uid + 1) == 0
    saved = Storage(s3_uri)
    assert [o.key for o in saved.list()] == ["team/buckets/ckpt/d/w.bin"]
    assert saved.get("team/buckets/ckpt/d/w.bin") == b"weights"


def test_a_mount_path_never_leaves_the_nodes_home_or_root(node, tmp_path):
    """`~//x` joined as `home / "/x"` was the host's /x, which the node (root
    on a local node) cleared and wrote: every path stays under its base."""
    store, home, fs = node
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("the host's")
    uri, sha = stored(store, one_file("f", b"the team's"))
    for path in (f"~/{outside}/keep", f"/{outside}/keep", "~/a/../../outside/keep", "relative/keep"):
        with pytest.raises(CodeError, match="not a path a mount may take"):
            place([Mount(path, "file", uri, sha)], home, fs)
    assert (outside / "keep").read_text() == "the host's"


def test_a_mount_is_placed_through_no_link_a_job_left(node, tmp_path):
    """A link planted in a bucket (`~/b/sub -> /anywhere`) does not carry a
    later mount's placing outside the node."""
    store, home, fs = node
    outside = tmp_path / "outside"
    outside.mkdir()
    (home / "b").mkdir()
    (home / "b" / "sub").symlink_to(outside, target_is_directory=True)
    uri, sha = stored(store, one_file("f", b"the team's"))
    with pytest.raises(CodeError, match="is a link"):
        place([Mount("~/b/sub/pwned", "file", uri, sha)], home, fs)
    assert list(outside.iterdir()) == []


def test_a_copied_bucket_brings_no_file_a_link_in_it_points_to(node, tmp_path):
    """COPY of a file:// bucket (as root on a local node) copies the bucket's
    own regular files; a link a job left there to a host file is not followed."""
    store, home, fs = node
    secret = tmp_path / "secret_key"
    secret.write_text("the broker's")
    bucket = store / "buckets" / "b"
    (bucket / "d").mkdir(parents=True)
    (bucket / "d" / "data.txt").write_text("the team's")
    (bucket / "leak").symlink_to(secret)
    (bucket / "dirlink").symlink_to(tmp_path, target_is_directory=True)
    place([Mount("~/copy", "bucket", f"file://{bucket}", mode="COPY")], home, fs)
    assert (home / "copy" / "d" / "data.txt").read_text() == "the team's"
    assert not (home / "copy" / "leak").exists() and not (home / "copy" / "dirlink").exists()


def test_a_bucket_that_cannot_be_copied_says_why_on_one_line(node, s3_uri, monkeypatch, capsys):  # noqa: F811
    from spotbroker.agent import mounts

    store, home, fs = node
    monkeypatch.setenv("HOME", str(home))
    missing = s3_uri.rstrip("/") + "-never-made/data"
    monkeypatch.setenv(mounts.ENV_MOUNTS, encode([Mount("~/data", "bucket", missing, mode="COPY")]))
    assert mounts.main([]) == 1
    err = capsys.readouterr().err
    # The node's last line is what the job shows: it must be the whole reason, not an error body's tail.
    assert err.count("\n") == 1 and err.startswith("spotbroker: file_mounts ~/data: "), err
    assert "never-made" in err
