"""SkyPilot's catalog files, so that a task file parses with no credentials
and no network, and no request waits on a catalog download.

SkyPilot reads its catalogs from `{runtime dir}/.sky/catalogs/v8/` and
downloads a missing one from its catalog repository inside whatever call
needs it (a task file naming an instance type or an accelerator does). Two
things keep that off the broker's requests:

* `place_missing` writes the broker's bundled rows (`broker/pricing/
  catalog_data/`, real SkyPilot catalog rows) where a cloud's file is
  missing. Each is written as SkyPilot writes a file it fetched: with its
  md5 in `.meta/`, so SkyPilot counts it as its own and replaces it by its
  own fetch once it is older than SkyPilot's pull interval (7 h for the
  clouds' files). A file without its `.meta` would count as placed by hand
  and never be refetched: stale rows for ever. `refresh_placed` fetches
  SkyPilot's current file at once, in the background, for each file still as
  the broker placed it (a file SkyPilot or a person replaced is left alone).
* `bound_downloads` gives every catalog download SkyPilot makes a timeout
  (it sets none): offline, a fetch fails in seconds and SkyPilot keeps the
  cached file (and retries after its interval) instead of holding a request.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from importlib import resources
from pathlib import Path

log = logging.getLogger(__name__)

# SkyPilot's catalog file -> the bundled files with its rows (one header: the files' columns are the same).
BUNDLED = {
    "aws/vms.csv": ("aws_vms_gpu.csv",),
    "gcp/vms.csv": ("gcp_vms_gpu.csv", "gcp_vms_n1.csv"),  # N1: the host of GCP's T4, V100, P100 and P4
    "azure/vms.csv": ("azure_vms_gpu.csv",),
    "common/accelerators.csv": ("common_accelerators.csv",),
}
# Where the broker notes the md5 of each file it placed: a file whose md5
# still matches is the broker's to refresh.
_MARKS = ".spotbroker"
DOWNLOAD_TIMEOUT = (3.05, 20.0)  # connect, read (seconds)
_lock = threading.Lock()
_ready = False


def catalog_dir() -> Path:
    """SkyPilot's own versioned catalog directory (it follows SKY_RUNTIME_DIR)."""
    from sky.catalog import common

    return Path(common.get_catalog_path("x")).parent


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _write(path: Path, data: bytes) -> None:
    """Atomically, as SkyPilot writes its own (readers see the old or the new file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("wb", dir=path.parent, delete=False) as f:
        f.write(data)
    os.replace(f.name, path)


def _adopt(root: Path, name: str, data: bytes) -> None:
    """Write `name` with its `.meta` md5, as SkyPilot does after a fetch."""
    _write(root / name, data)
    _write(root / ".meta" / f"{name}.md5", _md5(data).encode())


def place_missing(root: Path | None = None) -> list[str]:
    """Write the bundled rows where SkyPilot has no file, or where the file
    is still as an older broker placed it and the rows have changed since;
    the names written."""
    root = root or catalog_dir()
    placed = []
    for name, bundled in BUNDLED.items():
        data = _bundled(bundled)
        if (root / name).exists() and not (still_placed(root, name) and (root / name).read_bytes() != data):
            continue
        _adopt(root, name, data)
        _write(root / _MARKS / f"{name}.md5", _md5(data).encode())
        placed.append(name)
    if placed:
        log.info("placed SkyPilot catalog files from the bundled snapshot: %s", ", ".join(placed))
    return placed


def _bundled(files: tuple[str, ...]) -> bytes:
    """The bundled files as one catalog file: the first one's header, every file's rows."""
    parts = [resources.files("spotbroker.broker.pricing").joinpath("catalog_data", f).read_bytes() for f in files]
    return parts[0] + b"".join(part.split(b"\n", 1)[1] for part in parts[1:])


def still_placed(root: Path, name: str) -> bool:
    """The file is exactly as the broker placed it."""
    mark, path = root / _MARKS / f"{name}.md5", root / name
    try:
        return mark.read_text() == _md5(path.read_bytes())
    except OSError:
        return False


def refresh_placed(root: Path | None = None, timeout: tuple[float, float] = DOWNLOAD_TIMEOUT) -> list[str]:
    """Replace each file still as the broker placed it by SkyPilot's current
    one (what SkyPilot's own fetch would write); the names replaced. Offline
    nothing changes, in at most `timeout` per file."""
    import requests
    from sky.skylet import constants

    root = root or catalog_dir()
    done = []
    for name in BUNDLED:
        if not still_placed(root, name):
            continue
        url = f"{constants.HOSTED_CATALOG_DIR_URL}/{constants.CATALOG_SCHEMA_VERSION}/{name}"
        try:
            r = requests.get(url, headers={"User-Agent": "SkyPilot/0.7"}, timeout=timeout)
            r.raise_for_status()
        except requests.RequestException as exc:
            log.info("SkyPilot catalog %s not refreshed (%s): the bundled rows stay until it is", name,
                     type(exc).__name__)
            continue
        _adopt(root, name, r.text.encode())
        (root / _MARKS / f"{name}.md5").unlink(missing_ok=True)
        done.append(name)
    return done


class _BoundedRequests:
    """`requests` as SkyPilot's catalog module uses it, with a timeout."""

    def __init__(self, real) -> None:
        self._real = real

    def get(self, *args, **kwargs):
        kwargs.setdefault("timeout", DOWNLOAD_TIMEOUT)
        return self._real.get(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._real, name)


def bound_downloads() -> None:
    """Give SkyPilot's catalog downloads a timeout (they have none)."""
    import requests
    from sky.catalog import common

    if not isinstance(common.requests, _BoundedRequests):
        common.requests = _BoundedRequests(requests)


def ensure(refresh: bool = True) -> None:
    """Once per process, before SkyPilot first reads a catalog: bound its
    downloads, place what is missing, and (unless told not to) try to
    replace what was placed with SkyPilot's current files in the background."""
    global _ready
    if _ready:
        return
    with _lock:
        if _ready:
            return
        bound_downloads()
        root = catalog_dir()
        try:
            place_missing(root)
        except OSError as exc:  # an unwritable home: SkyPilot fetches (bounded) what it needs
            log.warning("cannot place SkyPilot catalog files: %s", exc)
        if refresh and any(still_placed(root, n) for n in BUNDLED):
            threading.Thread(target=refresh_placed, args=(root,), name="sky-catalog-refresh", daemon=True).start()
        _ready = True
