"""The job's code on the node: fetched from real storage (a directory, moto's
S3), verified, and unpacked only when every member stays inside the tree."""
from __future__ import annotations

import gzip
import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from spotbroker.agent.checkpoint.storage import Storage
from spotbroker.agent.code import CodeError, check_archive, fetch_code


def archive(tmp_path: Path, *members: tuple[tarfile.TarInfo, bytes | None]) -> Path:
    path = tmp_path / "code.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def file(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, data


def special(name: str, kind: bytes, link: str = "", mode: int = 0o644) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    return info, None


def stored(tmp_path: Path, path: Path, root: str | None = None) -> tuple[str, str]:
    store = Storage(root or (tmp_path / "store").as_uri())
    store.put_file("team/uploads/code.tar.gz", path)
    return store.url("team/uploads/code.tar.gz"), hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_archive_is_unpacked_as_a_fresh_workdir_and_nothing_else_is_left(tmp_path):
    path = archive(tmp_path, file("train.py", b"print('hi')\n", 0o755), file("sub/data.txt", b"d", 0o444),
                   special("sub/link", tarfile.SYMTYPE, "data.txt"),
                   special("same", tarfile.LNKTYPE, "train.py", 0o755))
    uri, sha = stored(tmp_path, path)
    node = tmp_path / "node"
    fetch_code(uri, sha, node / "workdir")
    workdir = node / "workdir"
    assert (workdir / "train.py").read_text() == "print('hi')\n" and (workdir / "train.py").stat().st_mode & 0o100
    assert (workdir / "sub" / "link").read_text() == "d" and (workdir / "same").read_text() == "print('hi')\n"
    assert (workdir / "sub" / "data.txt").stat().st_mode & 0o200  # the job may write in its own tree
    assert sorted(p.name for p in node.iterdir()) == ["workdir"]  # no archive, no staging left beside it
    with pytest.raises(CodeError, match="already there"):
        fetch_code(uri, sha, workdir)  # made once per attempt


def test_an_archive_that_is_not_what_the_job_was_submitted_with_is_refused(tmp_path):
    uri, sha = stored(tmp_path, archive(tmp_path, file("train.py")))
    with pytest.raises(CodeError, match="not the 0+ the job was submitted with"):
        fetch_code(uri, "0" * 64, tmp_path / "node" / "workdir")
    with pytest.raises(CodeError, match="cannot download"):
        fetch_code(uri.replace("code.tar.gz", "other.tar.gz"), sha, tmp_path / "node" / "workdir")
    assert not (tmp_path / "node" / "workdir").exists()


@pytest.mark.parametrize("member, why", [
    (file("../evil.py"), "outside the working directory"),
    (file("/etc/cron.d/evil"), "outside the working directory"),
    (file("a/../../evil"), "outside the working directory"),
    (special("out", tarfile.SYMTYPE, "/etc/passwd"), "link out"),
    (special("sub/out", tarfile.SYMTYPE, "../../x"), "link out"),
    (special("hard", tarfile.LNKTYPE, "/etc/passwd"), "hard link"),
    (special("dev", tarfile.CHRTYPE), "device"),
    (special("fifo", tarfile.FIFOTYPE), "device, fifo"),
])
def test_unsafe_members_are_refused_before_anything_is_unpacked(tmp_path, member, why):
    path = archive(tmp_path, file("ok.py"), member)
    uri, sha = stored(tmp_path, path)
    with pytest.raises(CodeError, match=why):
        fetch_code(uri, sha, tmp_path / "node" / "workdir")
    assert not (tmp_path / "node" / "workdir").exists() and not (tmp_path / "evil.py").exists()


def test_garbage_and_too_much_are_refused(tmp_path, monkeypatch):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not an archive")
    with pytest.raises(CodeError, match="not a gzipped tar"):
        check_archive(junk)
    monkeypatch.setattr("spotbroker.agent.code.MAX_FILES_BYTES", 1000)
    with pytest.raises(CodeError, match="more than the limit of 1000"):
        check_archive(archive(tmp_path, file("a", b"x" * 600), file("b", b"x" * 600)))


def test_the_code_comes_from_s3_too(tmp_path, s3_uri):
    uri, sha = stored(tmp_path, archive(tmp_path, file("train.py", b"s3\n")), root=s3_uri)
    fetch_code(uri, sha, tmp_path / "workdir")
    assert (tmp_path / "workdir" / "train.py").read_text() == "s3\n"


def _claiming(tmp_path: Path, kind: bytes, claimed: int) -> Path:
    """An archive whose first header (a GNU long name, a pax header) claims
    `claimed` bytes of name, which tarfile reads into memory whole."""
    header = tarfile.TarInfo("././@LongLink")
    header.type, header.size = kind, claimed
    path = tmp_path / "claiming.tar.gz"
    with gzip.open(path, "wb") as gz:
        gz.write(header.tobuf(tarfile.GNU_FORMAT) + b"a" * 4096 + b"\0" * 10240)
    return path


@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE])
def test_a_header_past_the_bound_is_refused_before_it_is_read(tmp_path, kind):
    """A 100 kB upload whose long names took 100 MB each of the broker's
    memory: one header can claim more than the broker has (a 500, or the
    broker killed for memory)."""
    with pytest.raises(CodeError, match="header of 1099511627776 bytes"):
        check_archive(_claiming(tmp_path, kind, 1 << 40))


@pytest.mark.parametrize("name, why", [("d/" * 1500 + "f", "directories deep"), ("n" * 5000, "bytes long")])
def test_a_name_too_deep_or_too_long_is_refused_before_anything_is_unpacked(tmp_path, name, why):
    """Past these no file system takes it, and the deep one's unpacking
    overflowed the broker's stack at the upload's check (a 500)."""
    path = archive(tmp_path, file(name))
    with pytest.raises(CodeError, match=why):
        check_archive(path)
    with pytest.raises(CodeError, match=why):
        fetch_code(*stored(tmp_path, path), tmp_path / "node" / "workdir")


def test_an_archive_made_of_a_directory_with_tar_c_dot_is_taken(tmp_path):
    """`tar czf code.tgz -C myproject .` (the README's recipe) names the
    working directory itself, `./`: it was refused as leading out through a
    link. Its modes are not the workdir's (the job may still write there)."""
    src = tmp_path / "myproject"
    (src / "sub").mkdir(parents=True)
    (src / "train.py").write_text("print(1)\n")
    (src / "sub" / "data.txt").write_text("d")
    src.chmod(0o555)
    path = tmp_path / "code.tgz"
    subprocess.run(["tar", "czf", str(path), "-C", str(src), "."], check=True)
    assert "./" in tarfile.open(path).getnames() or "." in tarfile.open(path).getnames()
    check_archive(path)
    uri, sha = stored(tmp_path, path)
    fetch_code(uri, sha, tmp_path / "node" / "workdir")
    workdir = tmp_path / "node" / "workdir"
    assert (workdir / "train.py").read_text() == "print(1)\n" and (workdir / "sub" / "data.txt").read_text() == "d"
    assert workdir.stat().st_mode & 0o700 == 0o700
    with pytest.raises(CodeError):  # a file named `.` is no working directory
        check_archive(archive(tmp_path, file(".")))


def directory(name: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info, None


# Archives whose members each pass on their own, judged as a whole: the broker
# judges them by name, without unpacking (check_archive); a node unpacks them
# on the file system. The two must agree, or a job learns at launch that its
# code cannot be unpacked (or a node unpacks what the broker refused).
WHOLE = {
    "links that lead out through one another": [special("d", tarfile.SYMTYPE, "."),
                                                  special("d/e", tarfile.SYMTYPE, ".."),
                                                  special("d/e/f", tarfile.SYMTYPE, "..")],
    "a file through a link to the parent": [directory("a"), special("a/up", tarfile.SYMTYPE, ".."),
                                            special("a/up/a/up2", tarfile.SYMTYPE, "../.."), file("a/up2/x")],
    "a hard link through a link out": [file("ok"), special("x", tarfile.SYMTYPE, "."),
                                       special("h", tarfile.LNKTYPE, "x/../ok")],
    "a directory where a file is, and a file under it": [file("x"), directory("x"), file("x/y")],
    "a file where a directory is": [directory("x"), file("x")],
    "a link where a directory is": [directory("x"), special("x", tarfile.SYMTYPE, "y")],
    "a file under a file": [file("x"), file("x/y")],
    "links in a loop": [special("a", tarfile.SYMTYPE, "b"), special("b", tarfile.SYMTYPE, "a"), file("a/f")],
}
STRICTER = {"links in a loop", "a link where a directory is"}
FINE = {
    "a link to a sibling, and files through it": [directory("data"), special("cur", tarfile.SYMTYPE, "data"),
                                                  file("cur/x"), directory("cur/sub"), file("cur/sub/y")],
    "a link replaced by a file": [special("l", tarfile.SYMTYPE, "t"), file("t"), file("l")],
    "a file written twice": [file("x", b"1"), file("x", b"2")],
    "a directory where a file is": [file("x"), directory("x")],
    "a link down and back up": [directory("a/b"), special("a/b/up", tarfile.SYMTYPE, "../.."), file("a/b/up/top")],
}


def _unpacks(tmp_path: Path, path: Path) -> bool:
    """Whether a node's own extraction (the data filter, on the file system) takes it."""
    dest = tmp_path / "real"
    try:
        with tarfile.open(path, "r:gz") as tar:
            tar.extractall(dest, filter="data")
        return True
    except (tarfile.TarError, OSError):
        return False


@pytest.mark.parametrize("case", sorted(WHOLE))
def test_an_archive_that_leads_out_or_clashes_as_a_whole_is_refused_without_unpacking(tmp_path, case):
    path = archive(tmp_path, *WHOLE[case])
    with pytest.raises(CodeError):
        check_archive(path)
    # The broker may be stricter than a node, never laxer: a loop, or a link
    # that cannot replace a directory, is refused here where tar shrugs.
    assert not _unpacks(tmp_path, path) or case in STRICTER


@pytest.mark.parametrize("case", sorted(FINE))
def test_an_archive_whose_links_stay_inside_is_taken_and_unpacks(tmp_path, case):
    path = archive(tmp_path, *FINE[case])
    check_archive(path)
    assert _unpacks(tmp_path, path)


def test_the_check_reads_the_archive_and_writes_nothing(tmp_path, monkeypatch):
    """The broker's check of an upload unpacked it to /tmp whole (250 MiB of
    disk for a 255 KB archive; 20 s for 99,990 empty files)."""
    def refuse(*args, **kwargs):
        raise AssertionError("the check wrote a file")

    path = archive(tmp_path, directory("d"), file("d/a", b"a" * 4096), special("d/l", tarfile.SYMTYPE, "a"))
    monkeypatch.setattr(tarfile.TarFile, "extractall", refuse)
    monkeypatch.setattr(tarfile.TarFile, "extract", refuse)
    monkeypatch.setattr(tarfile.TarFile, "makefile", refuse)
    members, total = check_archive(path)
    assert [m.name for m in members] == ["d", "d/a", "d/l"] and total == 4096


def _deep(n: int, part: str = "c") -> str:
    return "/".join([part] * n)


@pytest.mark.parametrize("shape", ["targets thousands deep", "a chain of links", "many deep directories"])
def test_an_archive_of_links_cannot_make_the_check_take_the_brokers_memory(tmp_path, shape):
    """A 1,233-byte upload of 20 links to 3,000-component targets, a file
    under each, took the broker from 288 MB to 599 MB (every directory above
    each member was a string of its own), and a 1 KB chain of links 29.5 s of
    CPU. Link targets are bounded as names are, and the tree is walked node by
    node, as deep and as large as a node could unpack."""
    import tracemalloc

    if shape == "targets thousands deep":
        members = [m for i in range(20) for m in (special(f"l{i}", tarfile.SYMTYPE, _deep(3000, f"c{i}")),
                                                  file(f"l{i}/f"))]
    elif shape == "a chain of links":  # each link leads 39 deeper through the one before it
        members = [special("l0", tarfile.SYMTYPE, _deep(39))]
        members += [special(f"l{i}", tarfile.SYMTYPE, f"l{i - 1}/" + _deep(39)) for i in range(1, 300)]
        members.append(file("l299/f"))
    else:  # 2,000 links, each to a directory 250 deep of its own, a file under each
        members = [m for i in range(2000) for m in (special(f"l{i}", tarfile.SYMTYPE, _deep(250, f"d{i}")),
                                                    file(f"l{i}/f"))]
    path = archive(tmp_path, *members)
    tracemalloc.start()
    try:
        with pytest.raises(CodeError, match="deep|more than"):
            check_archive(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 128 << 20, peak


def test_links_within_the_bounds_still_lead_where_they_lead(tmp_path):
    deep = _deep(100)
    path = archive(tmp_path, directory(deep), special("l", tarfile.SYMTYPE, deep), file("l/x"),
                   special("m", tarfile.SYMTYPE, "l"), file("m/y"))
    check_archive(path)
    assert _unpacks(tmp_path, path)
    assert (tmp_path / "real" / deep / "x").exists() and (tmp_path / "real" / deep / "y").exists()
    with pytest.raises(CodeError, match="a file"):  # and a clash through them is still one
        check_archive(archive(tmp_path, directory(deep), special("l", tarfile.SYMTYPE, deep), file("l/x"),
                              special("m", tarfile.SYMTYPE, "l/x"), file("m/y")))
