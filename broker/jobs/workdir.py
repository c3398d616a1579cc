"""Packing a job's workdir on the client, as SkyPilot's client does before it
uploads one to its API server.

`pack(root, out)` writes a gzipped tar of the directory's files to `out` and
returns its sha256. What is left out, as SkyPilot does: when `.skyignore`
is at the top of the directory, its patterns, and nothing else; without it,
every `.gitignore` of the tree, each for the directory it is in (git's
pattern rules: `*`, `**`, `/anchored`, `dir/`, `!negation`). `.git/` is
never packed.

Refused, with a `WorkdirError` naming the directory (and the file): a
directory that is missing or cannot be read, a link that points out of it,
and files over `MAX_FILES_BYTES` in all. Links inside it are kept (made
relative, so they hold wherever the tree is unpacked); fifos, sockets and
devices are skipped. The archive is the same for the same files (sorted,
no owner names, no time in the gzip header), so submitting unchanged code
again uploads nothing.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import re
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from spotbroker.agent.code import MAX_FILES_BYTES, MAX_MEMBERS

# (bytes of the files read so far, of all of them): packing's progress, for a bar
Progress = Callable[[int, int], None]

ALWAYS_LEFT_OUT = (".git",)


class WorkdirError(Exception):
    """The workdir cannot be packed: why, naming it."""


@dataclass
class Packed:
    sha256: str
    bytes: int        # the archive's
    files: int
    file_bytes: int   # the files', unpacked


# --- ignore rules (git's pattern language) ---------------------------------------


def _translate(pattern: str) -> str:
    """A gitignore glob as a regular expression over '/'-separated paths."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == n:
            out.append("/.*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1:end]
            body = "^" + body[1:] if body[0] in "!^" else body
            out.append(f"[{body.replace(chr(92), chr(92) * 2)}]")
            i = end + 1
        elif pattern[i] == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


@dataclass
class _Rule:
    base: str            # the directory of the file the rule is in, relative to the root ("" = the root)
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


def _parse(text: str, base: str) -> list[_Rule]:
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip("\n\r")
        while line.endswith(" ") and not line.endswith("\\ "):
            line = line[:-1]
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line[1:] if negate else line.removeprefix("\\")
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        body = _translate(line.lstrip("/"))
        regex = re.compile(("^" if anchored else "^(?:.*/)?") + body + "$")
        rules.append(_Rule(base, regex, negate, dir_only))
    return rules


@dataclass
class _Ignore:
    rules: list[_Rule] = field(default_factory=list)
    per_directory: bool = True   # .gitignore at every level; False: the root's .skyignore only

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """The last rule that matches decides, as in git."""
        verdict = False
        for rule in self.rules:
            if rule.base and not rel.startswith(rule.base + "/"):
                continue
            sub = rel[len(rule.base) + 1:] if rule.base else rel
            if (is_dir or not rule.dir_only) and rule.regex.match(sub):
                verdict = not rule.negate
        return verdict


def _read_rules(path: Path, base: str, root: Path) -> list[_Rule]:
    try:
        return _parse(path.read_text(errors="replace"), base)
    except OSError as exc:
        raise WorkdirError(f"workdir {root}: cannot read {path.name} in {base or '.'}: {exc.strerror}") from None


# --- walking and packing -----------------------------------------------------------


@dataclass
class _Entry:
    rel: str
    kind: str            # "dir", "file", "link"
    link: str = ""       # a link's target, relative to the link's directory
    size: int = 0


def collect(root: Path) -> list[_Entry]:
    """What `pack` would put in the archive, checked (WorkdirError otherwise)."""
    try:
        is_dir = root.is_dir()
    except OSError as exc:
        raise WorkdirError(f"workdir {root}: cannot read it: {exc.strerror}") from None
    if not is_dir:
        raise WorkdirError(f"workdir {root} {'is not a directory' if root.exists() else 'does not exist'}")
    real_root = os.path.realpath(root)
    skyignore = root / ".skyignore"
    ignore = _Ignore()
    if skyignore.is_file():
        ignore = _Ignore(_read_rules(skyignore, "", root), per_directory=False)
    entries: list[_Entry] = []
    total = 0
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        here = root / rel_dir if rel_dir else root
        try:
            names = sorted(os.listdir(here))
        except OSError as exc:
            raise WorkdirError(f"workdir {root}: cannot read {rel_dir or '.'}: {exc.strerror}") from None
        if ignore.per_directory and ".gitignore" in names and (here / ".gitignore").is_file():
            ignore.rules.extend(_read_rules(here / ".gitignore", rel_dir, root))
        for name in names:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            path = here / name
            try:
                st = path.lstat()
            except OSError as exc:
                raise WorkdirError(f"workdir {root}: cannot read {rel}: {exc.strerror}") from None
            is_dir = stat.S_ISDIR(st.st_mode)
            if name in ALWAYS_LEFT_OUT and is_dir or ignore.ignored(rel, is_dir):
                continue
            if stat.S_ISLNK(st.st_mode):
                entries.append(_Entry(rel, "link", link=_link_inside(root, real_root, path, rel)))
            elif is_dir:
                entries.append(_Entry(rel, "dir"))
                stack.append(rel)
            elif stat.S_ISREG(st.st_mode):
                if not os.access(path, os.R_OK):
                    raise WorkdirError(f"workdir {root}: cannot read {rel}: permission denied")
                total += st.st_size
                if total > MAX_FILES_BYTES:
                    raise WorkdirError(
                        f"workdir {root} holds more than {MAX_FILES_BYTES // 2**20} MiB of files: leave out what the "
                        "job does not need (.skyignore, or .gitignore), or put data in a bucket")
                entries.append(_Entry(rel, "file", size=st.st_size))
            if len(entries) > MAX_MEMBERS:  # (each is a member of the archive, which nodes unpack to this bound)
                raise WorkdirError(
                    f"workdir {root} holds more than {MAX_MEMBERS} files and directories: leave out what the job "
                    "does not need (.skyignore, or .gitignore), or put data in a bucket")
    entries.sort(key=lambda e: e.rel)
    return entries


def _link_inside(root: Path, real_root: str, path: Path, rel: str) -> str:
    """A link's target made relative, if the target is inside the workdir."""
    target = os.path.realpath(path)
    if target != real_root and not target.startswith(real_root + os.sep):
        raise WorkdirError(f"workdir {root} holds a link out of itself: {rel} -> {os.readlink(path)}")
    return os.path.relpath(target, os.path.dirname(os.path.join(real_root, rel)))


def pack(root: Path, out: BinaryIO, progress: Progress | None = None) -> Packed:
    """Write the workdir's archive to `out`; its sha256, size and contents.
    `progress(read, total)` is told of the files' bytes as they are read."""
    root = Path(os.path.abspath(os.path.expanduser(root)))
    entries = collect(root)
    hashing = _HashingWriter(out)
    counted = _Counted(sum(e.size for e in entries), progress)
    with gzip.GzipFile(fileobj=hashing, mode="wb", mtime=0, compresslevel=6) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            tar_add(tar, root, entry, counted)
    files = [e for e in entries if e.kind == "file"]
    return Packed(hashing.digest.hexdigest(), hashing.size, len(files), sum(e.size for e in files))


def pack_file(path: Path, out: BinaryIO, progress: Progress | None = None) -> Packed:
    """A single-file mount's archive: the file alone, under its own name
    (the node places it at the mount's path: agent/mounts.py)."""
    path = Path(os.path.abspath(os.path.expanduser(path)))
    try:
        st = path.stat()
    except OSError as exc:
        raise WorkdirError(f"workdir {path}: cannot read it: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode) or not os.access(path, os.R_OK):
        raise WorkdirError(f"workdir {path}: not a readable file")
    if st.st_size > MAX_FILES_BYTES:
        raise WorkdirError(f"workdir {path} is more than {MAX_FILES_BYTES // 2**20} MiB: put data in a bucket")
    hashing = _HashingWriter(out)
    with gzip.GzipFile(fileobj=hashing, mode="wb", mtime=0, compresslevel=6) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar_add(tar, path.parent, _Entry(path.name, "file", size=st.st_size), _Counted(st.st_size, progress))
    return Packed(hashing.digest.hexdigest(), hashing.size, 1, st.st_size)


def tar_add(tar: tarfile.TarFile, root: Path, entry: _Entry, counted: _Counted | None = None) -> None:
    path = root / entry.rel
    info = tarfile.TarInfo(entry.rel)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if entry.kind == "link":
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, entry.link, 0o777
        tar.addfile(info)
        return
    st = path.stat()
    info.mtime, info.mode = int(st.st_mtime), stat.S_IMODE(st.st_mode)
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        return
    try:
        with open(path, "rb") as f:
            info.size = os.fstat(f.fileno()).st_size
            tar.addfile(info, counted.reading(f) if counted and counted.progress else f)
    except OSError as exc:
        raise WorkdirError(f"workdir {root}: cannot read {entry.rel}: {exc.strerror}") from None


class _Counted:
    """The files' bytes read so far, told to `progress` as each read returns."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total, self.progress, self.read = total, progress, 0

    def reading(self, f: BinaryIO) -> _CountingReader:
        return _CountingReader(f, self)


class _CountingReader:
    def __init__(self, f: BinaryIO, counted: _Counted) -> None:
        self.f, self.counted = f, counted

    def read(self, size: int = -1) -> bytes:
        data = self.f.read(size)
        self.counted.read += len(data)
        self.counted.progress(self.counted.read, self.counted.total)
        return data


class _HashingWriter:
    """A file object that hashes and counts what passes through it."""

    def __init__(self, out: BinaryIO) -> None:
        self.out, self.digest, self.size = out, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()
