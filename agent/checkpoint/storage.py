"""One object-storage API for ``s3://``, ``gs://``, ``az://`` and ``file://`` URIs.

Built on obstore, which speaks S3, GCS and Azure Blob through one Rust client
with multipart uploads and connection reuse. A :class:`Storage` is rooted at a
URI; every key is a ``/``-separated path relative to that root::

    store = Storage("s3://bucket/team/job/attempt")
    store.put("step-000000000100/part-00000.bin", data)
    store.get("step-000000000100/part-00000.bin", start=0, end=16)

S3 endpoints follow the standard environment, so a local stand-in such as
moto's server or MinIO works with no code change: ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``. With an
endpoint set, requests are path-style (stand-ins rarely have wildcard DNS) and
plain HTTP is allowed when the endpoint is ``http://``. Over HTTPS the body is
not hashed for the signature (as boto3 does; set ``AWS_UNSIGNED_PAYLOAD=false``
to sign it anyway): TLS protects it, and checkpoints carry their own sha256.

On a node the broker launched with credentials scoped to its job, the agent
keeps them fresh in a file (``SPOTBROKER_STORAGE_CREDENTIALS_FILE``, see
:mod:`spotbroker.agent.credentials`): the checkpoint root's bucket, and that
bucket only, is then reached with them (through obstore's credential
provider, read again whenever obstore's cached ones come near their end) at
the endpoint and region the broker named. Every other bucket (a dataset the
trainer reads with its own keys or the node's identity) is reached as off a
node, from the standard environment.

``gs://bucket/path`` and ``az://container/path`` take their credentials (and
Azure its account, ``AZURE_STORAGE_ACCOUNT_NAME``) from the environment as
obstore documents them; ``GOOGLE_BASE_URL`` is GCS's endpoint setting.

``file://`` writes are atomic and durable: the bytes go to a temporary file
beside the target (``name#<digits>``, a name obstore's listing skips),
are fsynced, then renamed over the target, and the directory is fsynced. A
writer killed at any moment leaves either the old object or the new one,
never a half object under the final name. Large local objects are written
with ``O_DIRECT`` where the file system allows it (through a page-aligned
bounce buffer): the page cache copy of a buffered write costs more CPU than
the disk time on small machines, and the checkpoint being written is not
read back by this process (see :mod:`spotbroker.agent.checkpoint.localfile`).
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import obstore

from spotbroker.agent.checkpoint import localfile
from spotbroker.agent.checkpoint.stores import Places, open_store

# bytes, bytearray, memoryview, or any 1-D contiguous uint8 buffer.
BytesLike = bytes | bytearray | memoryview

SCHEMES = ("s3", "gs", "az", "file")

# Objects above this size are uploaded in parts, in parallel.
MULTIPART_THRESHOLD = 64 * 1024 * 1024
PART_SIZE = 16 * 1024 * 1024
MAX_CONCURRENCY = 8
# Large ranged reads are split into pieces fetched in parallel.
READ_PIECE = 16 * 1024 * 1024


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object: its key relative to the storage root, its size."""

    key: str
    size: int
    last_modified: datetime | None = None


def join_uri(uri: str, *keys: str) -> str:
    """``join_uri("s3://b/p", "step-1", "MANIFEST.json")`` → ``s3://b/p/step-1/MANIFEST.json``."""
    parts = [uri.rstrip("/")] + [k.strip("/") for k in keys if k.strip("/")]
    return "/".join(parts)


def _scheme_and_path(uri: str) -> tuple[str, str, str]:
    """Split a URI into (scheme, bucket-or-empty, path without slashes at the ends)."""
    if "://" not in uri:
        # A bare path is a local directory: convenient on a laptop.
        return "file", "", str(Path(uri).resolve())
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme == "s3a":
        scheme = "s3"
    if scheme not in SCHEMES:
        raise ValueError(f"unsupported storage URI {uri!r}: use one of {', '.join(s + '://' for s in SCHEMES)}")
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"file URI must be absolute (file:///path): {uri!r}")
        return "file", "", unquote(parsed.path).rstrip("/") or "/"
    if not parsed.netloc:
        raise ValueError(f"storage URI without a bucket: {uri!r}")
    return scheme, parsed.netloc, unquote(parsed.path).strip("/")


def _not_found(exc: BaseException) -> bool:
    return isinstance(exc, (FileNotFoundError, obstore.exceptions.NotFoundError))


class Storage:
    """Objects under one root URI.

    Thread-safe: the underlying obstore clients are, and local writes use
    unique temporary names. Keys never start with ``/``.
    """

    def __init__(self, uri: str, *, max_concurrency: int = MAX_CONCURRENCY,
                 multipart_threshold: int = MULTIPART_THRESHOLD, part_size: int = PART_SIZE) -> None:
        self.scheme, self._bucket, self._path = _scheme_and_path(uri)
        self.uri = uri.rstrip("/") if "://" in uri else f"file://{self._path}"
        self.max_concurrency = max_concurrency
        self.multipart_threshold = multipart_threshold
        self.part_size = part_size
        self._local_root = Path(self._path) if self.scheme == "file" else None
        # A local root may not exist yet (obstore refuses that): open on first use.
        self._opened: Any = None if self._local_root is not None else open_store(
            self.scheme, self._bucket, self._path)

    def __repr__(self) -> str:
        return f"Storage({self.uri!r})"

    @property
    def _store(self) -> Any:
        if self._opened is None:
            assert self._local_root is not None
            if not self._local_root.is_dir():
                raise FileNotFoundError(f"no such directory: {self._local_root}")
            self._opened = open_store(self.scheme, self._bucket, self._path)
        return self._opened

    def _at(self, key: str) -> Any:
        """The store that serves `key`: the root's, or on an Azure node the one
        whose SAS covers `key` (a listing's prefix ends with '/')."""
        store = self._store
        return store.for_key(key) if isinstance(store, Places) else store

    @property
    def is_local(self) -> bool:
        return self._local_root is not None

    @property
    def location(self) -> tuple[str, str]:
        """(bucket or container, the root's path in it); ("", path) on a local disk."""
        return self._bucket, self._path

    def url(self, key: str = "") -> str:
        """The full URI of ``key``."""
        return join_uri(self.uri, key)

    def child(self, key: str) -> Storage:
        """A Storage rooted at ``key`` below this root."""
        return Storage(self.url(key), max_concurrency=self.max_concurrency,
                       multipart_threshold=self.multipart_threshold, part_size=self.part_size)

    # --- writes -------------------------------------------------------------

    def put(self, key: str, data: BytesLike | Sequence[BytesLike], *, digest: Any = None) -> None:
        """Store ``data`` under ``key``, replacing any object there; atomic.

        ``data`` may be a list of buffers, stored one after the other (written
        in place on a local disk, joined in memory for a cloud store).
        ``digest`` (a hashlib object), when given, is updated with every byte
        stored, while it is written (on a local disk, from the same cache-warm
        chunks that go to the file).
        """
        if isinstance(data, (list, tuple)):
            segments = [memoryview(d).cast("B") for d in data]
        else:
            segments = [memoryview(data).cast("B")]
        if self._local_root is not None:
            total = sum(segment.nbytes for segment in segments)
            direct = bool(localfile.O_DIRECT) and total >= localfile.DIRECT_THRESHOLD

            def write(fd: int) -> None:
                if direct:
                    localfile.write_direct(fd, segments, digest)
                    return
                for segment in segments:
                    if digest is not None:
                        digest.update(segment)
                    localfile.write_all(fd, segment)
            self._local_put(key, write, direct=direct)
            return
        if digest is not None:
            for segment in segments:
                digest.update(segment)
        view = segments[0] if len(segments) == 1 else memoryview(b"".join(segments))
        multipart = view.nbytes > self.multipart_threshold
        obstore.put(self._at(key), key, view, use_multipart=multipart,
                    chunk_size=self.part_size, max_concurrency=self.max_concurrency)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Upload a local file (multipart and parallel when large); atomic."""
        source = Path(path)
        if self._local_root is not None:
            def copy(fd: int) -> None:
                with open(source, "rb") as src, os.fdopen(os.dup(fd), "wb", buffering=0) as dst:
                    shutil.copyfileobj(src, dst, localfile.WRITE_CHUNK)
            self._local_put(key, copy)
            return
        multipart = source.stat().st_size > self.multipart_threshold
        obstore.put(self._at(key), key, source, use_multipart=multipart,
                    chunk_size=self.part_size, max_concurrency=self.max_concurrency)

    def _local_put(self, key: str, write: Any, direct: bool = False) -> None:
        assert self._local_root is not None
        target = self._local_root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = localfile.staging_path(target)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            fd = os.open(temp, flags | (localfile.O_DIRECT if direct else 0), 0o644)
        except OSError:
            if not direct:
                raise
            fd = os.open(temp, flags, 0o644)  # a file system without O_DIRECT (tmpfs): buffered
        try:
            write(fd)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            temp.unlink(missing_ok=True)
            raise
        os.close(fd)
        os.replace(temp, target)
        localfile.fsync_dir(target.parent)

    # --- reads --------------------------------------------------------------

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        """The bytes of ``key``, or of ``[start, end)`` of it (end exclusive)."""
        if start is None and end is None:
            return bytes(obstore.get(self._at(key), key).bytes())
        begin = start or 0
        stop = end if end is not None else self.size(key)
        if stop <= begin:
            return b""
        return bytes(obstore.get_range(self._at(key), key, start=begin, end=stop))

    def get_into(self, key: str, out: memoryview | bytearray, start: int = 0) -> int:
        """Read ``len(out)`` bytes of ``key`` from ``start`` into ``out``; large reads in parallel."""
        view = memoryview(out).cast("B")
        length = view.nbytes
        if length == 0:
            return 0
        if self._local_root is not None:
            with open(self._local_root / key, "rb", buffering=0) as f:
                f.seek(start)
                got = 0
                while got < length:
                    n = f.readinto(view[got:])
                    if not n:
                        raise EOFError(f"{self.url(key)}: {got} of {length} bytes from offset {start}")
                    got += n
            return length
        starts = list(range(start, start + length, READ_PIECE))
        ends = [min(s + READ_PIECE, start + length) for s in starts]
        for s, piece in zip(starts, obstore.get_ranges(self._at(key), key, starts=starts, ends=ends)):
            chunk = memoryview(piece)
            if chunk.nbytes != min(READ_PIECE, start + length - s):
                raise EOFError(f"{self.url(key)}: short read at offset {s}")
            view[s - start:s - start + chunk.nbytes] = chunk
        return length

    def get_file(self, key: str, path: str | os.PathLike[str]) -> int:
        """Download ``key`` into a local file, atomically (temp file + rename)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = localfile.staging_path(target)
        written = 0
        try:
            with open(temp, "wb") as f:
                if self._local_root is not None:
                    with open(self._local_root / key, "rb") as src:
                        shutil.copyfileobj(src, f, localfile.WRITE_CHUNK)
                    written = f.tell()
                else:
                    for chunk in obstore.get(self._at(key), key).stream(min_chunk_size=PART_SIZE):
                        f.write(chunk)
                        written += len(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, target)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        return written

    # --- metadata -----------------------------------------------------------

    def head(self, key: str) -> ObjectInfo | None:
        """Size and time of ``key``, or None when there is no such object."""
        try:
            meta = obstore.head(self._at(key), key)
        except Exception as exc:
            if _not_found(exc):
                return None
            raise
        return ObjectInfo(key=meta["path"], size=int(meta["size"]), last_modified=meta["last_modified"])

    def size(self, key: str) -> int:
        info = self.head(key)
        if info is None:
            raise FileNotFoundError(self.url(key))
        return info.size

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    def iter(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with the path segments of ``prefix`` (recursive)."""
        if self._local_root is not None and not self._local_root.is_dir():
            return
        prefix = prefix.strip("/")
        try:
            for batch in obstore.list(self._at(f"{prefix}/" if prefix else ""), prefix or None, chunk_size=1000):
                for meta in batch:
                    yield ObjectInfo(key=meta["path"], size=int(meta["size"]),
                                     last_modified=meta["last_modified"])
        except Exception as exc:
            if not _not_found(exc):
                raise

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """:meth:`iter` as a list sorted by key."""
        return sorted(self.iter(prefix), key=lambda o: o.key)

    # --- deletes ------------------------------------------------------------

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing object is not an error."""
        self.delete_many([key])

    def delete_many(self, keys: list[str]) -> None:
        """Remove objects in the given order (bulk where the store allows)."""
        if not keys:
            return
        if self._local_root is not None:
            # One by one, in order: callers rely on it (manifest before parts).
            for key in keys:
                try:
                    obstore.delete(self._at(key), key)
                except Exception as exc:
                    if not _not_found(exc):
                        raise
            return
        by_store: dict[int, tuple[Any, list[str]]] = {}
        for key in keys:  # one bulk delete per store (an Azure node's: per SAS place)
            store = self._at(key)
            by_store.setdefault(id(store), (store, []))[1].append(key)
        for store, some in by_store.values():
            try:
                obstore.delete(store, some)
            except Exception as exc:
                if not _not_found(exc):
                    raise

    def delete_prefix(self, prefix: str) -> int:
        """Remove every object under ``prefix``; returns how many."""
        keys = [o.key for o in self.iter(prefix)]
        self.delete_many(keys)
        if self._local_root is not None:
            localfile.remove_staging_leftovers(self._local_root / prefix.strip("/"))
        return len(keys)


def parallel_map(fn: Any, items: list[Any], workers: int) -> list[Any]:
    """``[fn(x) for x in items]`` on up to ``workers`` threads; the first error is raised."""
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(fn, items))
