"""`spotbroker submit FILE` with a workdir: what is packed (SkyPilot's rules:
.skyignore, else every .gitignore), and the clear error for a workdir that
cannot travel, at submission, before anything reaches the broker."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from spotbroker.broker.jobs.workdir import WorkdirError, pack


def packed_names(root: Path) -> set[str]:
    out = io.BytesIO()
    pack(root, out)
    with tarfile.open(fileobj=io.BytesIO(out.getvalue()), mode="r:gz") as tar:
        return {m.name for m in tar if not m.isdir()}


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_gitignore_files_are_honoured_at_every_level_as_git_reads_them(tmp_path):
    root = tree(tmp_path / "proj", {
        ".gitignore": "*.log\n/build/\ndata/\n!keep.log\n# comment\n**/cache/*.bin\n",
        "train.py": "", "run.log": "", "keep.log": "", "build/out.o": "", "src/build/mod.py": "",
        "data/x.csv": "", "src/data/y.csv": "", "src/cache/a.bin": "", "src/cache/a.txt": "",
        "src/.gitignore": "*.tmp\n/local.py\n", "src/a.tmp": "", "src/local.py": "", "src/deep/local.py": "",
        ".git/HEAD": "ref", "a.tmp": "",
    })
    assert packed_names(root) == {
        ".gitignore", "train.py", "keep.log", "src/build/mod.py", "src/cache/a.txt", "src/.gitignore",
        "src/deep/local.py", "a.tmp"}


def test_a_skyignore_replaces_every_gitignore(tmp_path):
    root = tree(tmp_path / "proj", {".skyignore": "*.ckpt\n", ".gitignore": "*.py\n", "train.py": "",
                                    "model.ckpt": "", "sub/.gitignore": "*\n", "sub/x.py": ""})
    assert packed_names(root) == {".skyignore", ".gitignore", "train.py", "sub/.gitignore", "sub/x.py"}


def test_links_inside_travel_as_relative_links_and_links_out_are_refused(tmp_path):
    root = tree(tmp_path / "proj", {"data/a.txt": "a", "train.py": ""})
    (root / "latest").symlink_to(root / "data" / "a.txt")  # absolute, but inside
    out = io.BytesIO()
    pack(root, out)
    with tarfile.open(fileobj=io.BytesIO(out.getvalue()), mode="r:gz") as tar:
        assert tar.getmember("latest").linkname == "data/a.txt"
    (root / "secrets").symlink_to("/etc")
    with pytest.raises(WorkdirError, match=f"workdir {root} holds a link out of itself: secrets -> /etc"):
        pack(root, io.BytesIO())
    (root / ".gitignore").write_text("secrets\n")  # a link left out is not looked at
    pack(root, io.BytesIO())


def test_the_same_files_make_the_same_archive(tmp_path):
    root = tree(tmp_path / "proj", {"train.py": "print(1)\n", "sub/b.py": ""})
    first, second = io.BytesIO(), io.BytesIO()
    assert pack(root, first).sha256 == pack(root, second).sha256
    assert first.getvalue() == second.getvalue()


def test_too_much_is_refused_naming_the_workdir(tmp_path, monkeypatch):
    monkeypatch.setattr("spotbroker.broker.jobs.workdir.MAX_FILES_BYTES", 1000)
    root = tree(tmp_path / "proj", {"a.bin": "x" * 600, "b.bin": "x" * 600})
    with pytest.raises(WorkdirError, match=f"workdir {root} holds more than"):
        pack(root, io.BytesIO())
    (root / ".skyignore").write_text("b.bin\n")
    pack(root, io.BytesIO())

    # Too many files: packed and uploaded whole, then refused by the broker as "body: more than 100000
    # files", naming neither the workdir nor what to do. The bound is the one nodes unpack with.
    from spotbroker.agent import code
    from spotbroker.broker.jobs import workdir

    assert workdir.MAX_MEMBERS == code.MAX_MEMBERS
    monkeypatch.setattr("spotbroker.broker.jobs.workdir.MAX_MEMBERS", 10)
    many = tree(tmp_path / "many", {f"f{i:02}.txt": "x" for i in range(11)})
    with pytest.raises(WorkdirError, match=f"workdir {many} holds more than 10 files and directories: leave out"):
        pack(many, io.BytesIO())
    (many / ".skyignore").write_text("f0*\n")
    pack(many, io.BytesIO())


# --- the command, as a user runs it ----------------------------------------------


def submit(task: Path, tmp_path: Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`spotbroker submit TASK` run in `cwd` (the file's directory unless said)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    env.update(HOME=str(tmp_path / "home"), SPOTBROKER_TOKEN="sbt_x", SPOTBROKER_URL="http://127.0.0.1:9")
    return subprocess.run([sys.executable, "-m", "spotbroker.broker.cli", "submit", str(task)], env=env,
                          cwd=cwd or task.parent, capture_output=True, text=True, timeout=60)


def test_relative_paths_are_read_from_the_current_directory_as_sky_launch_reads_them(tmp_path):
    """SkyPilot's docs: a relative `workdir` is read from where `sky launch`
    runs, not from the file's directory (`sky launch sky/train.yaml` with
    `workdir: .` uploads the project, not `sky/`); local mount sources too."""
    proj = tmp_path / "proj"
    task = tree(proj, {"sky/task.yaml": "run: python train.py\nworkdir: .\nfile_mounts:\n  /data: ./data\n",
                       "train.py": "", "data/x": ""}) / "sky" / "task.yaml"
    r = submit(task, tmp_path, cwd=proj)
    assert r.returncode == 1 and "cannot reach the broker" in r.stderr, r.stderr  # packed: the broker is missing
    assert f"uploading workdir {proj}: 3 files" in r.stderr, r.stderr
    # A path that is only beside the file: said so, with what to do.
    task.write_text("run: python train.py\nworkdir: ./code\n")
    tree(proj, {"sky/code/train.py": ""})
    r = submit(task, tmp_path, cwd=proj)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert (f"{task}:2: workdir: {proj / 'code'} does not exist; the task file's directory has code: relative "
            "paths are read from the current directory, as `sky launch` reads them") in r.stderr, r.stderr
    r = submit(task, tmp_path)  # run from there: found
    assert r.returncode == 1 and f"uploading workdir {proj / 'sky' / 'code'}: 1 files" in r.stderr, r.stderr


def test_a_workdir_that_cannot_travel_is_named_at_submission(tmp_path):
    proj = tmp_path / "proj"
    task = tree(proj, {"task.yaml": "run: python train.py\nworkdir: ./code\n"}) / "task.yaml"
    r = submit(task, tmp_path)
    assert r.returncode == 1 and f"workdir {proj / 'code'} does not exist" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    tree(proj, {"code/train.py": ""})
    (proj / "code" / "escape").symlink_to(tmp_path)
    r = submit(task, tmp_path)
    assert r.returncode == 1 and "holds a link out of itself: escape" in r.stderr and "Traceback" not in r.stderr
    (proj / "code" / "escape").unlink()
    r = submit(task, tmp_path)  # packed fine: now it is the broker that is missing
    assert r.returncode == 1 and "cannot reach the broker" in r.stderr and "Traceback" not in r.stderr


def test_a_directory_that_cannot_travel_is_named_with_its_file_line_and_field(tmp_path):
    """As any other mistake in the file: where it is, and which field (a file
    mount's directory was once called the workdir, with no file or line)."""
    proj = tmp_path / "proj"
    task = tree(proj, {"task.yaml": "run: python train.py\nworkdir: ./code\n", "data/x": ""}) / "task.yaml"
    (proj / "data" / "escape").symlink_to(tmp_path)
    r = submit(task, tmp_path)
    assert r.returncode == 1 and f"{task}:2: workdir {proj / 'code'} does not exist" in r.stderr, r.stderr
    task.write_text("run: python train.py\nfile_mounts:\n  /data: ./data\n")
    r = submit(task, tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{task}:3: file_mounts./data: {proj / 'data'} holds a link out of itself: escape" in r.stderr, r.stderr
    task.write_text("run: python train.py\nfile_mounts:\n  /data: ./nowhere\n")
    r = submit(task, tmp_path)
    assert r.returncode == 1 and f"{task}:3: file_mounts./data: {proj / 'nowhere'} does not exist" in r.stderr


def hide(path: Path, user: int | None) -> None:
    if user is not None:
        os.chown(path, 0, 0)  # root's, out of the user's reach
    path.chmod(0)


_PACK = """
import io, sys
from spotbroker.broker.jobs.workdir import WorkdirError, pack
try:
    pack(sys.argv[1], io.BytesIO())
except WorkdirError as exc:
    sys.exit(str(exc))
"""


def test_an_unreadable_file_or_directory_is_named(tmp_path):
    """The packer run by a user who cannot read part of the tree (as root: a
    uid of the local jobs' range, with the jobs' interpreter; root reads everything)."""
    import shutil
    import tempfile

    user, python = None, sys.executable
    if os.geteuid() == 0:
        from spotbroker.broker.launch.local import job_python_default
        from spotbroker.broker.settings import Settings

        user = user_gid = Settings(_env_file=None).local_uids.start  # a bare uid: no passwd entry needed
        python = job_python_default()
    base = Path(tempfile.mkdtemp(prefix="spotbroker-unreadable-"))
    try:
        base.chmod(0o755)
        proj = tree(base / "proj", {"train.py": "", "secret.key": "k", "private/x": ""})
        for path in (proj, *proj.rglob("*")):
            if user is not None:
                os.chown(path, user, -1)
            path.chmod(0o755 if path.is_dir() else 0o644)
        for hidden, name in ((proj / "secret.key", "secret.key"), (proj / "private", "private")):
            hide(hidden, user)
            # As the job user wholly: with root's group kept, a checkout whose group is root and
            # whose mode gives the group nothing (mktemp -d's 0700, then o+x) could not be entered.
            as_user = {"user": user, "group": user_gid, "extra_groups": []} if user is not None else {}
            r = subprocess.run([python, "-c", _PACK, str(proj)], cwd="/", capture_output=True,
                               text=True, timeout=60, **as_user)
            assert r.returncode == 1 and f"workdir {proj}: cannot read {name}" in r.stderr, r.stderr
            shutil.rmtree(hidden) if hidden.is_dir() else hidden.unlink()
    finally:
        shutil.rmtree(base, ignore_errors=True)
