"""A job's file mounts, placed on its node before `setup` runs.

The broker resolves each mount of the job's file to a `Mount` (what it is,
where it comes from) and hands the list to every node (the local node's
spec; a SkyPilot node's `SPOTBROKER_MOUNTS` variable). Here each is put at
its path:

* `dir`: an uploaded directory, fetched, checked against its sha256 and
  unpacked as `agent/code.py` does the job's workdir;
* `file`: an uploaded single file (an archive of one regular file), placed
  at the path itself;
* `bucket`: a storage prefix. A `file://` one is linked at the path in
  MOUNT modes (what the job writes is in the bucket at once, as with
  SkyPilot's MOUNT) and copied in COPY mode; a cloud one is copied, object by
  object, with the node's own credentials. On a SkyPilot node SkyPilot
  mounts cloud buckets itself (its MOUNT and COPY), so those are skipped;
  a local node, which has no mount to write through, saves what the job
  left in a writable one when the job ends (`save`), as SkyPilot's
  MOUNT_CACHED uploads a node's writes after the fact.

`~/P` is under the node's home; an absolute path is under `fs_root` (`/` on
a cloud VM; the node's own directory on the local launcher, which has no
file system of its own to give a job).

    python -I -m spotbroker.agent.mounts [--no-cloud-buckets]   (reads SPOTBROKER_MOUNTS)
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from spotbroker.agent.code import CodeError, fetch_code
from spotbroker.agent.protocol import ENV_MOUNTS

KINDS = ("dir", "file", "bucket")


@dataclass(frozen=True)
class Mount:
    path: str                  # as the job's file wrote it: absolute, or ~/...
    kind: str                  # dir | file | bucket
    uri: str                   # the upload's archive, or the bucket prefix
    sha256: str | None = None  # an upload's
    mode: str = "COPY"         # a bucket's: MOUNT | COPY | MOUNT_CACHED
    read_only: bool = False    # a bucket's: the node's credentials only read it

    @classmethod
    def parse(cls, doc: dict) -> Mount:
        mount = cls(**doc)
        if mount.kind not in KINDS or (mount.kind != "bucket" and not mount.sha256):
            raise ValueError(f"not a mount: {doc!r}")
        return mount

    def document(self) -> dict:
        return asdict(self)


def encode(mounts: list[Mount]) -> str:
    return json.dumps([m.document() for m in mounts], separators=(",", ":"))


def decode(text: str) -> list[Mount]:
    return [Mount.parse(doc) for doc in json.loads(text or "[]")]


def target(path: str, home: Path, fs_root: Path) -> Path:
    """Where the mount `path` is on this node: always under `home` or
    `fs_root`, through no link (the node may place it as root, and a link
    on the way, one a job left in a bucket, would take it anywhere)."""
    base, rel = (home, path[2:]) if path.startswith("~/") else (fs_root, path[1:] if path.startswith("/") else "")
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") for p in parts):
        raise CodeError(f"file_mounts {path}: not a path a mount may take")
    here = base
    for part in parts[:-1]:
        here = here / part
        if here.is_symlink():
            raise CodeError(f"file_mounts {path}: {here} is a link; a mount is placed through none")
    return base.joinpath(*parts)


def _made_parent(dest: Path) -> None:
    """dest's parent, made. On a cloud VM an absolute path outside the SSH
    user's reach (`/data`) is made with sudo and given to the user, as
    SkyPilot does for its own file mounts."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except PermissionError:
        owner = f"{os.getuid()}:{os.getgid()}"
        for command in (["sudo", "-n", "mkdir", "-p", str(dest.parent)],
                        ["sudo", "-n", "chown", owner, str(dest.parent)]):
            if subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True).returncode != 0:
                raise CodeError(f"cannot make {dest.parent}: permission denied (and no sudo)") from None


def _clear(dest: Path) -> None:
    """What an earlier placement left at dest (the same node placing again): gone."""
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    elif dest.is_dir():
        shutil.rmtree(dest)


def place_file(uri: str, sha256: str, dest: Path) -> None:
    """An uploaded single file: the archive's one regular file, at dest."""
    staging = dest.parent / f".{dest.name}.mount"
    _clear(staging)
    fetch_code(uri, sha256, staging)
    try:
        files = [p for p in staging.rglob("*") if p.is_symlink() or not p.is_dir()]
        if len(files) != 1 or files[0].is_symlink() or not files[0].is_file():
            raise CodeError(f"{uri}: a single-file mount's archive holds one regular file")
        _clear(dest)
        os.replace(files[0], dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _regular_files(root: Path, owner_uid: int | None = None) -> Iterator[tuple[str, int]]:
    """(key under `root`, an open descriptor) of each regular file below
    it (of `owner_uid`, when given), each opened without following a link
    and walked through no linked directory. On a local node this runs as
    root: a link a job left in a bucket must never make it read a file of
    the host's. The descriptor is closed once the next is asked for."""
    for top, _dirs, files, dir_fd in os.fwalk(root, follow_symlinks=False):
        rel_top = os.path.relpath(top, root)
        for name in files:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=dir_fd)
            except OSError:
                continue  # a link, or gone
            try:
                info = os.fstat(fd)
                if stat.S_ISREG(info.st_mode) and (owner_uid is None or info.st_uid == owner_uid):
                    yield (name if rel_top == "." else f"{rel_top}/{name}"), fd
            finally:
                os.close(fd)


def _copy_directory(source: Path, dest: Path) -> None:
    """A `file://` bucket copied: its regular files only (`_regular_files`)."""
    if source.is_symlink() or not source.is_dir():
        raise CodeError(f"{source}: not a directory")
    dest.mkdir(parents=True, exist_ok=True)
    for key, fd in _regular_files(source):
        out = dest / key
        out.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.dup(fd), "rb") as src, open(out, "xb") as dst:
            shutil.copyfileobj(src, dst)


def one_line(exc: BaseException, limit: int = 400) -> str:
    """An error as one line: the node's last line is the reason its job shows,
    and an object store's error runs over lines (a response body, a retry
    chain) whose last is a lone "}". The service's error code is kept."""
    text = str(exc)
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    code = re.search(r"<Code>([^<]{1,64})</Code>", text)
    if code and code.group(1) not in first:
        first = f"{first} ({code.group(1)})"
    return first if len(first) <= limit else first[:limit - 3] + "..."


def _copy_bucket(uri: str, dest: Path) -> None:
    from spotbroker.agent.checkpoint.storage import Storage

    if uri.startswith("file://"):
        _copy_directory(Path(uri.removeprefix("file://")), dest)
        return
    store = Storage(uri)
    dest.mkdir(parents=True, exist_ok=True)
    for info in store.iter():
        key = info.key
        parts = key.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise CodeError(f"{uri}: an object named {key!r} cannot be a file under {dest}")
        store.get_file(key, dest / key)


def place(mounts: list[Mount], home: Path, fs_root: Path, cloud_buckets: bool = True) -> list[Path]:
    """Put every mount at its path; the paths placed (CodeError: which one failed, and why)."""
    placed = []
    for mount in mounts:
        if mount.kind == "bucket" and not mount.uri.startswith("file://") and not cloud_buckets:
            continue
        dest = target(mount.path, home, fs_root)
        try:
            _made_parent(dest)
            if mount.kind == "dir":
                _clear(dest)
                fetch_code(mount.uri, mount.sha256 or "", dest)
            elif mount.kind == "file":
                place_file(mount.uri, mount.sha256 or "", dest)
            elif mount.uri.startswith("file://") and mount.mode != "COPY":
                source = Path(mount.uri.removeprefix("file://"))
                if not mount.read_only:  # a bucket of the team's, by name: it exists from its first mount on
                    source.mkdir(parents=True, exist_ok=True)
                _clear(dest)
                dest.symlink_to(source, target_is_directory=True)
            else:
                _clear(dest)
                _copy_bucket(mount.uri, dest)
        except (CodeError, OSError) as exc:
            raise CodeError(f"file_mounts {mount.path}: {one_line(exc)}") from None
        except Exception as exc:  # the object store's own errors (obstore's): a bucket missing, refused
            raise CodeError(f"file_mounts {mount.path}: {mount.uri}: {one_line(exc)}") from None
        placed.append(dest)
    return placed


def written_back(mount: Mount) -> bool:
    """A cloud bucket the job may write, mounted (not copied): where there is
    no mount to write through (a local node), its files are saved to the
    bucket when the job ends (`save`)."""
    return mount.kind == "bucket" and not mount.read_only and mount.mode != "COPY" \
        and not mount.uri.startswith("file://")


def save(mounts: list[Mount], home: Path, fs_root: Path, owner_uid: int | None = None) -> int:
    """Upload what the job left in its writable cloud buckets' places; the
    files saved: the job's regular files (of `owner_uid`, when given), read
    through their descriptors (`_regular_files`)."""
    from spotbroker.agent.checkpoint.storage import Storage

    saved = 0
    for mount in mounts:
        if not written_back(mount):
            continue
        dest = target(mount.path, home, fs_root)
        if dest.is_symlink() or not dest.is_dir():
            continue
        store = Storage(mount.uri)
        for key, fd in _regular_files(dest, owner_uid):
            store.put_file(key, f"/proc/self/fd/{fd}")
            saved += 1
    return saved


def main(argv: list[str]) -> int:
    try:
        mounts = decode(os.environ.get(ENV_MOUNTS, ""))
        placed = place(mounts, Path.home(), Path("/"), cloud_buckets="--no-cloud-buckets" not in argv)
    except (CodeError, ValueError, TypeError) as exc:
        print(f"spotbroker: {one_line(exc, 1000)}", file=sys.stderr, flush=True)
        return 1
    for path in placed:
        print(f"spotbroker: placed {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
