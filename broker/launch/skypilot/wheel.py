"""The wheelhouse a SkyPilot node installs the agent from, with no package index.

Built once per code version from what this broker runs (cached under
`{data_dir}/wheels/{key}/`): a wheel of the `spotbroker` package as
installed (editable or not), and a wheel of each distribution its base
requirements need (httpx, click, obstore, nvidia-ml-py and theirs), repacked from this
environment with the tags they were installed with. The node runs
`pip install --no-index --find-links WHEELHOUSE spotbroker` (`node.py`),
so its agent is the broker's own code, at the broker's own versions.

A compiled dependency (obstore) is only good for a node of the same
platform and Python as the broker: SkyPilot's default images are x86_64
Linux; a broker elsewhere must run on the nodes' Python (docs/skypilot.md).
"""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

PACKAGE = "spotbroker"
SUBPACKAGES = ("agent", "api", "broker", "migrations")
# What `spotbroker agent` needs (pyproject's base dependencies; nvidia-ml-py
# reads the GPUs' energy, agent/energy.py).
BASE_ROOTS = ("httpx", "click", "obstore", "nvidia-ml-py")
_SKIP_META = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


def wheelhouse(cache: Path) -> Path:
    """The wheelhouse of this code version, built if it is not cached yet."""
    package = _package_dir()
    key = _code_key(package)
    target = cache / key
    if (target / ".complete").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    _spotbroker_wheel(package, target)
    for dist in _closure(BASE_ROOTS):
        _repack(dist, target)
    (target / ".complete").write_text("")
    return target


def _package_dir() -> dict[str, Path]:
    """Where each part of the installed package is (an editable install maps
    each subpackage to a directory of its own)."""
    import importlib.util

    import spotbroker

    parts = {}
    if getattr(spotbroker, "__file__", None):
        parts[""] = Path(spotbroker.__file__).parent
    for name in SUBPACKAGES:
        spec = importlib.util.find_spec(f"{PACKAGE}.{name}")
        parts[name] = Path(next(iter(spec.submodule_search_locations)))
    return parts


def _code_files(package: dict[str, Path]) -> dict[str, Path]:
    """Archive name -> file, for every file of the package but caches."""
    out = {}
    for name, root in package.items():
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
                if name == "" and path.relative_to(root).parts[0] in SUBPACKAGES:
                    continue
                out["/".join(p for p in (PACKAGE, name, path.relative_to(root).as_posix()) if p)] = path
    return out


def _code_key(package: dict[str, Path]) -> str:
    digest = hashlib.sha256()
    for name, path in _code_files(package).items():
        digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _record_line(name: str, data: bytes) -> list[str]:
    sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={sha}", str(len(data))]


def _write_wheel(path: Path, files: dict[str, bytes], dist_info: str) -> None:
    rows = [_record_line(name, data) for name, data in files.items()]
    record = io.StringIO()
    csv.writer(record, lineterminator="\n").writerows([*rows, [f"{dist_info}/RECORD", "", ""]])
    tmp = path.with_suffix(".part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{dist_info}/RECORD", record.getvalue())
    os.replace(tmp, path)


def _spotbroker_wheel(package: dict[str, Path], target: Path) -> None:
    version = metadata.version(PACKAGE)
    dist_info = f"{PACKAGE}-{version}.dist-info"
    files = {name: path.read_bytes() for name, path in _code_files(package).items()}
    requires = [str(r) for r in metadata.requires(PACKAGE) or [] if "extra ==" not in str(r)]
    files[f"{dist_info}/METADATA"] = "\n".join(
        ["Metadata-Version: 2.1", f"Name: {PACKAGE}", f"Version: {version}", "Requires-Python: >=3.11",
         *(f"Requires-Dist: {r}" for r in requires), ""]).encode()
    files[f"{dist_info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: spotbroker\nRoot-Is-Purelib: true\n"
                                   b"Tag: py3-none-any\n")
    files[f"{dist_info}/entry_points.txt"] = b"[console_scripts]\nspotbroker = spotbroker.broker.cli:main\n"
    _write_wheel(target / f"{PACKAGE}-{version}-py3-none-any.whl", files, dist_info)


def _closure(roots: tuple[str, ...]) -> list[metadata.Distribution]:
    """The installed distributions `roots` need, theirs included (markers evaluated here)."""
    env, seen, out, todo = default_environment(), set(), [], list(roots)
    while todo:
        name = _normal(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        dist = metadata.distribution(name)
        out.append(dist)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
                todo.append(req.name)
    return out


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _repack(dist: metadata.Distribution, target: Path) -> None:
    """A wheel of an installed distribution, with the tags it was installed with."""
    name, version = dist.metadata["Name"], dist.version
    wheel_meta = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel_meta.splitlines() if line.startswith("Tag:")]
    tag = ".".join(sorted({t.split("-")[0] for t in tags})) + "-" + ".".join(sorted({t.split("-")[1] for t in tags})) \
        + "-" + ".".join(sorted({t.split("-")[2] for t in tags})) if tags else "py3-none-any"
    files = {}
    for entry in dist.files or []:
        rel = entry.as_posix()
        if rel.startswith("..") or "__pycache__" in rel or Path(rel).name in _SKIP_META:
            continue
        path = Path(dist.locate_file(entry))
        if path.is_file():
            files[rel] = path.read_bytes()
    dist_info = next((r.split("/")[0] for r in files if r.split("/")[0].endswith(".dist-info")),
                     f"{name.replace('-', '_')}-{version}.dist-info")
    _write_wheel(target / f"{name.replace('-', '_')}-{version}-{tag}.whl", files, dist_info)
