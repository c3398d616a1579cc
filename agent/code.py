"""The job's code on the node: an uploaded workdir, fetched, verified and unpacked.

`spotbroker submit` packs a job's `workdir` into a gzipped tar and uploads
it to the broker, which keeps it under the team's storage prefix, named by
its sha256 (`PUT /v1/uploads/{sha256}`). Every attempt's node gets it as a
fresh working directory: `fetch_code` downloads the archive, checks that its
bytes hash to what the job was submitted with, and unpacks it.

An archive is refused (`CodeError`, saying which member and why) unless
every member is a regular file, a directory, or a link that stays inside
the tree: no absolute names, no `..`, no link out, no device files, fifos
or sockets, and no more than `MAX_FILES_BYTES` unpacked. The broker checks
an upload with the same function (`check_archive`) before it stores it; the
node checks again before it unpacks, since what it fetches is only as
trustworthy as the store it comes from.
"""
from __future__ import annotations

import hashlib
import os
import posixpath
import shutil
import tarfile
import tempfile
from pathlib import Path

from spotbroker.agent.codetree import Tree, TreeError

# What a workdir may hold, unpacked (the client checks it before packing too),
# and the most an archive of it may weigh (tar headers, incompressible files).
MAX_FILES_BYTES = 256 * 1024 * 1024
MAX_ARCHIVE_BYTES = MAX_FILES_BYTES + 64 * 1024 * 1024
MAX_MEMBERS = 100_000
MAX_NAME_BYTES = 4096  # PATH_MAX: no file system takes a longer name
MAX_NAME_DEPTH = 256   # directories deep: unpacking recurses once per level
MAX_HEADER_BYTES = 16 * 1024  # a long name's or a pax header's: a name within MAX_NAME_BYTES, and a few records
MAX_TAR_BYTES = 2 * MAX_FILES_BYTES  # the whole tar stream: the files, and a header or two each
_CHUNK = 1024 * 1024


class CodeError(Exception):
    """The job's code cannot be used: why, naming the member at fault."""


class _BoundedInfo(tarfile.TarInfo):
    """tarfile reads a long name or a pax header into memory whole, at the
    size its header claims (and a sparse file's map block by block): past
    the bound it is refused unread, or one small upload could take more
    memory than the broker has."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise CodeError(f"{self.name[:100]!r}: a sparse file (pack it without --sparse)")
        if self.type in _NAME_HEADERS and self.size > MAX_HEADER_BYTES:
            raise CodeError(f"a long name or pax header of {self.size} bytes (at most {MAX_HEADER_BYTES})")
        return super()._proc_member(tarfile_)


_NAME_HEADERS = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                 tarfile.SOLARIS_XHDTYPE)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _inside(name: str) -> str | None:
    """`name` normalised, or None when it is absolute or climbs out of the tree."""
    if not name or name.startswith("/") or "\x00" in name:
        return None
    norm = posixpath.normpath(name)
    if norm == ".." or norm.startswith("../"):
        return None
    return norm


def _check_member(member: tarfile.TarInfo, seen_files: set[str]) -> None:
    name = _inside(member.name)
    if name is None:
        raise CodeError(f"{member.name!r}: a name outside the working directory")
    if len(name.encode(errors="surrogateescape")) > MAX_NAME_BYTES:
        raise CodeError(f"{name[:100]!r}...: a name {len(name.encode(errors='surrogateescape'))} bytes long "
                        f"(at most {MAX_NAME_BYTES})")
    if name.count("/") >= MAX_NAME_DEPTH:
        raise CodeError(f"{name[:100]!r}...: {name.count('/')} directories deep (at most {MAX_NAME_DEPTH})")
    if member.isfile() or member.isdir():
        return
    if member.issym() or member.islnk():  # a target is a name too: bounded as names are
        target = member.linkname
        if len(target.encode(errors="surrogateescape")) > MAX_NAME_BYTES or target.count("/") >= MAX_NAME_DEPTH:
            raise CodeError(f"{member.name!r}: a link to a name over {MAX_NAME_BYTES} bytes or {MAX_NAME_DEPTH} "
                            "directories deep")
    if member.issym():
        if member.linkname.startswith("/") or _inside(posixpath.join(posixpath.dirname(name),
                                                                     member.linkname)) is None:
            raise CodeError(f"{member.name!r}: a link out of the working directory ({member.linkname!r})")
        return
    if member.islnk():
        target = _inside(member.linkname)
        if target is None or target not in seen_files:
            raise CodeError(f"{member.name!r}: a hard link to {member.linkname!r}, which is not a file before it")
        return
    raise CodeError(f"{member.name!r}: not a file, directory or link (a device, fifo or socket)")


def check_archive(path: Path) -> tuple[list[tarfile.TarInfo], int]:
    """The members of a workdir archive and their unpacked bytes; CodeError
    when it is not a gzipped tar, or when any member is unsafe or too much.
    Read as a stream, header by header (the bounds hold before a member's
    data is read), and nothing is written."""
    size = path.stat().st_size
    if size > MAX_ARCHIVE_BYTES:
        raise CodeError(f"the archive is {size} bytes, over the limit of {MAX_ARCHIVE_BYTES}")
    members: list[tarfile.TarInfo] = []
    seen_files: set[str] = set()
    tree = Tree()
    total = 0
    try:
        with tarfile.open(path, "r:gz", tarinfo=_BoundedInfo) as tar:
            for member in tar:
                _check_member(member, seen_files)
                if member.isdir() and posixpath.normpath(member.name) == ".":
                    continue  # `tar czf code.tgz -C dir .` names the working directory itself: nothing to make
                if member.isfile():
                    seen_files.add(posixpath.normpath(member.name))
                    total += member.size
                members.append(member)
                if total > MAX_FILES_BYTES:
                    raise CodeError(f"the files unpack to more than the limit of {MAX_FILES_BYTES} bytes")
                if len(members) > MAX_MEMBERS:
                    raise CodeError(f"more than {MAX_MEMBERS} files")
                if tar.offset > MAX_TAR_BYTES:  # headers (pax, long names) past what the files need
                    raise CodeError(f"the archive unpacks to more than {MAX_TAR_BYTES} bytes of tar")
                tree.add(member)
    except TreeError as exc:
        raise CodeError(str(exc)) from None
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise CodeError(f"not a gzipped tar archive ({exc})") from None
    return members, total


def unpack(archive: Path, workdir: Path) -> None:
    """Unpack a checked archive into `workdir`, which must not exist yet (or
    be empty). It appears whole or not at all: the files go to a directory
    beside it first, which is renamed into place."""
    members, _ = check_archive(archive)
    if workdir.exists() and (not workdir.is_dir() or any(workdir.iterdir())):
        raise CodeError(f"{workdir} is already there: an attempt's working directory is made once")
    staging = Path(tempfile.mkdtemp(prefix=".workdir-", dir=workdir.parent))
    try:
        with tarfile.open(archive, "r:gz", tarinfo=_BoundedInfo) as tar:
            # The "data" filter refuses again what check_archive refused, and
            # clears setuid bits and group/other write.
            tar.extractall(staging, members=members, filter="data")
        _owner_can_write(staging)
        if workdir.exists():
            workdir.rmdir()
        staging.rename(workdir)
    except (tarfile.TarError, OSError) as exc:
        raise CodeError(f"cannot unpack the archive: {exc}") from None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _owner_can_write(root: Path) -> None:
    """The job may write in its own working directory, whatever modes were packed."""
    for top, dirs, files in os.walk(root):
        for name in dirs:
            path = os.path.join(top, name)
            os.chmod(path, os.stat(path).st_mode | 0o700)
        for name in files:
            path = os.path.join(top, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o600)
    root.chmod(0o700)


def fetch_code(uri: str, sha256: str, workdir: Path) -> None:
    """Download the archive at `uri`, check its sha256, unpack it as `workdir`.

    The archive is kept beside `workdir` while it is checked, never in it,
    and removed afterwards: the job's tree holds its own files only."""
    parent, _, name = uri.rstrip("/").rpartition("/")
    if not parent or not name:
        raise CodeError(f"{uri!r} is not the URI of an object")
    workdir.parent.mkdir(parents=True, exist_ok=True)
    archive = workdir.parent / ".code.tar.gz"
    from spotbroker.agent.checkpoint.storage import Storage  # here: the client's packer imports this module's limits

    try:
        try:
            Storage(parent).get_file(name, archive)
        except Exception as exc:  # obstore's errors have no common base worth naming
            raise CodeError(f"cannot download {uri}: {exc}") from None
        got = sha256_file(archive)
        if got != sha256:
            raise CodeError(f"{uri} has sha256 {got}, not the {sha256} the job was submitted with")
        unpack(archive, workdir)
    finally:
        archive.unlink(missing_ok=True)
