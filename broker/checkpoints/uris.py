"""Where a job's checkpoints live, and the broker's checks on them.

An attempt writes under its own prefix, ``{root}/{team}/{job}/{attempt}``,
and a checkpoint of step N is ``{prefix}/step-{N:012d}/`` with
``MANIFEST.json`` written last (DESIGN.md). The broker never takes an
agent's word for a location: a reported URI is accepted only when it names
exactly that place (else it is refused), the broker stores the URI it builds
itself, and keeping a checkpoint writes its ``KEEP`` marker through the
storage layer, into that place, after reading its manifest back.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlparse

from spotbroker.agent import protocol
from spotbroker.agent.checkpoint.format import FORMAT, KEEP_MARKER
from spotbroker.agent.checkpoint.storage import Storage

SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "az": "az", "file": "file"}
MAX_URI = 2048
MAX_STEP = 2**63 - 1
# Names a manifest may list: plain object names in the checkpoint's own directory.
_OBJECT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


class BadCheckpointUri(ValueError):
    """A reported checkpoint URI that is not this attempt's own place for that step."""


class CheckpointUnverified(Exception):
    """A stored checkpoint that cannot be confirmed in storage (so it is not kept)."""


def job_prefix(root: str, team: str, job_id: int) -> str:
    return f"{root.rstrip('/')}/{team}/{job_id}"


def attempt_prefix(root: str, team: str, job_id: int, attempt_id: int) -> str:
    return f"{job_prefix(root, team, job_id)}/{attempt_id}"


def checkpoint_uri(prefix: str, step: int) -> str:
    return f"{prefix}/{protocol.step_dir(step)}"


def accepted_uri(reported: object, prefix: str, step: int) -> str:
    """The URI to store for a reported checkpoint of `step`: the broker's own
    spelling of ``{prefix}/step-N``, when `reported` names exactly that
    (``s3a://`` for ``s3://``, ``file://localhost/`` for ``file:///`` and
    percent-escapes are the same place). Anything else raises BadCheckpointUri
    saying why: another scheme or bucket, a relative path, ``.``/``..``
    segments, somewhere outside the prefix, or another step's directory."""
    if not isinstance(reported, str) or not reported:
        raise BadCheckpointUri("a checkpoint URI must be a non-empty string")
    expected = checkpoint_uri(prefix, step)
    if _place(reported) != _place(expected):
        raise BadCheckpointUri(f"not this attempt's place for step {step}: expected {expected}")
    return expected


def _place(uri: str) -> tuple[str, str, tuple[str, ...]]:
    """(scheme, bucket, path segments) of an absolute storage URI, as the
    storage layer would act on it; BadCheckpointUri if it is not one."""
    if len(uri) > MAX_URI or any(ord(c) < 32 or c == "\x7f" for c in uri):
        raise BadCheckpointUri(f"a checkpoint URI has at most {MAX_URI} printable characters")
    if "://" not in uri:
        if uri.startswith("/"):  # a bare absolute path: the storage layer's file://
            return "file", "", _segments(uri)
        raise BadCheckpointUri("a checkpoint URI must be absolute, such as s3://bucket/path or file:///path")
    try:
        parsed = urlparse(uri)
    except ValueError as exc:
        raise BadCheckpointUri(f"unparsable URI: {exc}") from None
    scheme = SCHEMES.get(parsed.scheme.lower())
    if scheme is None:
        raise BadCheckpointUri(f"unsupported scheme {parsed.scheme!r}: use one of s3, gs, az, file")
    if parsed.query or parsed.fragment or parsed.params:
        raise BadCheckpointUri("a checkpoint URI has no query, fragment or parameters")
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise BadCheckpointUri("a file URI must be absolute: file:///path")
        return "file", "", _segments(parsed.path)
    if not parsed.netloc:
        raise BadCheckpointUri("a checkpoint URI names its bucket")
    return scheme, parsed.netloc, _segments(parsed.path)


def _segments(path: str) -> tuple[str, ...]:
    # Unescaped first, as the storage layer does: %2e%2e is "..", %2f a separator.
    parts = unquote(path).strip("/").split("/")
    if any(p in ("", ".", "..") for p in parts) or "\x00" in path:
        raise BadCheckpointUri("a checkpoint URI has no empty, '.' or '..' segments")
    return tuple(parts)


def verify_and_keep(root: str, uri: str, step: int) -> None:
    """Write the KEEP marker of the committed checkpoint at `uri` (which the
    caller built from the attempt's prefix), after reading back its manifest:
    it must be a manifest of this format and step, and every object it lists
    must be there at its size. Raises CheckpointUnverified otherwise, having
    written nothing."""
    try:
        _verify_and_keep(root, uri, step)
    except CheckpointUnverified:
        raise
    except Exception as exc:  # storage unreachable, refused: no reason for a 500
        raise CheckpointUnverified(f"its storage could not be read or written ({type(exc).__name__})") from None


def _verify_and_keep(root: str, uri: str, step: int) -> None:
    if not Storage(uri).is_local:
        _check_and_mark(Storage(uri), step)
        return
    with _pinned(root, uri) as pinned:
        _check_and_mark(Storage(pinned), step, local_dir=_local_path(pinned))


def _check_and_mark(storage: Storage, step: int, local_dir: Path | None = None) -> None:
    """`local_dir`: the checkpoint's directory on a local disk, whose files the
    job owns: a link there would have the broker (root, maybe) read or size a
    file of its choosing, so none is followed."""
    if local_dir is not None:
        _no_link(local_dir, protocol.MANIFEST)
    try:
        manifest = json.loads(storage.get(protocol.MANIFEST))
        objects = manifest["objects"]
        ok = manifest.get("format") == FORMAT and int(manifest["step"]) == step and isinstance(objects, dict)
    except FileNotFoundError:
        raise CheckpointUnverified("it has no manifest (never committed, or deleted since)") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointUnverified(f"its manifest is unreadable ({type(exc).__name__})") from None
    if not ok:
        raise CheckpointUnverified(f"its manifest is not a {FORMAT} manifest of step {step}")
    for name, entry in objects.items():
        if not _OBJECT_NAME.fullmatch(str(name)) or name in (".", ".."):
            raise CheckpointUnverified(f"its manifest lists an odd object name {str(name)[:64]!r}")
        if local_dir is not None:
            _no_link(local_dir, name)
        info = storage.head(name)
        size = entry.get("size") if isinstance(entry, dict) else None
        if info is None or info.size != size:
            raise CheckpointUnverified(f"{name} is missing or not the size its manifest says")
    storage.put(KEEP_MARKER, b"")


def _no_link(directory: Path, name: str) -> None:
    if os.path.islink(directory / name):
        raise CheckpointUnverified(f"{name} is a link, which a checkpoint never holds")


@contextmanager
def _pinned(root: str, uri: str) -> Iterator[str]:
    """A file:// URI for the checkpoint's directory that no later rename or
    link can redirect. On a local disk the job owns its prefix and could swap
    a directory for a link out of it (and the broker may be root): the
    directory is opened one component at a time below the root, never
    following a link, and used through /proc/self/fd, so the marker lands in
    that very directory even if the path changes meanwhile. The root itself
    may be reached through links."""
    root_path, path = _local_path(root), _local_path(uri)
    try:
        below = path.relative_to(root_path)
    except ValueError:
        raise CheckpointUnverified("it is not under the checkpoint root") from None
    fd = os.open(root_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in below.parts:
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                raise CheckpointUnverified("it has no manifest (its directory does not exist)") from None
            except OSError as exc:  # ELOOP, ENOTDIR: a link, or not a directory
                raise CheckpointUnverified(f"its directory is reached through a link ({exc.strerror})") from None
            os.close(fd)
            fd = child
        pinned = Path(f"/proc/self/fd/{fd}")
        if pinned.is_dir():
            yield pinned.as_uri()
        else:  # no /proc: check the real path instead (a rename in between is not caught)
            if os.path.realpath(path) != os.path.join(os.path.realpath(root_path), below):
                raise CheckpointUnverified("its directory is reached through a link")
            yield uri
    finally:
        os.close(fd)


def _local_path(uri: str) -> Path:
    return Path(unquote(urlparse(uri).path) if "://" in uri else os.path.abspath(uri))
