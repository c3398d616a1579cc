"""A local node's provisioning, as root for a team's uid, against another
process of the same team that swaps names for links while root works."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotbroker.broker.launch import local_node
from spotbroker.broker.launch.identity import SYSTEM_PATH
from spotbroker.broker.launch.local_node import NodeSpec, ProvisionError, provision

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: only root provisions for another uid")
TEAM = (1_900_000_077, 1_900_000_077)


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory the team's uid may pass through (pytest's own are root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="spotbroker-provision-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path)


def victim(tmp_path: Path) -> Path:
    """Root's own files, e.g. the broker's data directory."""
    v = tmp_path / "victim"
    (v / "sub").mkdir(parents=True, mode=0o700)
    (v / "secret_key").write_text("root's")
    (v / "sub" / "db").write_text("root's")
    return v


def owners(root: Path) -> set[int]:
    return {p.lstat().st_uid for p in [root, *root.rglob("*")]}


def as_team(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/sh", "-c", script], user=TEAM[0], group=TEAM[1], extra_groups=[],
                          env={"PATH": SYSTEM_PATH}, capture_output=True, text=True, timeout=60)


def test_another_process_of_the_team_cannot_swap_the_code_for_a_link_while_root_hands_it_over(
        base, monkeypatch):
    """A team's running job renamed the next node's `workdir` and left a link
    to root's files in its place, between the fetch and the hand-over: root
    then gave the link's target to the team (the broker's secret key and
    database, on a real broker)."""
    runs = base / "runs"
    runs.mkdir(mode=0o711)
    target = victim(base)
    node = runs / "7" / "node-0"
    raced = {}

    def fetch_code(uri, sha256, workdir):  # what the real fetch leaves: root's files, then the racer's turn
        workdir.mkdir()
        (workdir / "train.py").write_text("print('hi')\n")
        raced["swap"] = as_team(f"mv {workdir} {node}/stash && ln -s {target} {workdir}")

    monkeypatch.setattr("spotbroker.agent.code.fetch_code", fetch_code)
    (runs / "7").mkdir(mode=0o711)
    spec = NodeSpec(rank=0, run_dir=str(runs / "7"), node_dir=str(node), command=["true"], env={},
                    owner=list(TEAM), code={"uri": "file:///x/code.tar.gz", "sha256": "0" * 64})
    workdir = provision(spec)
    assert raced["swap"].returncode != 0, raced["swap"]  # the node was root's: no name in it could change
    assert owners(target) == {0}
    assert owners(workdir) == {TEAM[0]} and (workdir / "train.py").read_text() == "print('hi')\n"
    info = node.stat()
    assert (info.st_uid, info.st_mode & 0o777) == (TEAM[0], 0o700)


def test_a_tree_handed_over_is_walked_without_following_a_link_at_its_top_or_below(tmp_path):
    target = victim(tmp_path)
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True)
    (tree / "a" / "link").symlink_to(target)
    (tree / "top").symlink_to(target / "secret_key")
    local_node._give_tree(tree, TEAM)
    assert owners(target) == {0}
    assert owners(tree) == {TEAM[0]}  # the links themselves are the team's
    with pytest.raises(ProvisionError, match="is a link"):
        local_node._give_tree(tree / "a" / "link", TEAM)
    assert owners(target) == {0}
