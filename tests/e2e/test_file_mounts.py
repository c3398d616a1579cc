"""A task file's `file_mounts`, end to end on the local launcher: submitted
with `spotbroker submit` as a user runs it, placed on the node before
`setup`, and a bucket by name that one job writes and the next one reads.

Local nodes have no file system of their own to give: `~/P` is in the
node's home, an absolute `/P` under `$SPOTBROKER_MOUNT_ROOT`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import timeline, wait_state

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
DONE = {"SUCCEEDED", "FAILED", "CANCELLED"}

WRITER = """name: writer
setup: |
  set -e
  test "$(cat ~/.ssh/sky-key)" = "the key"
  test -f ~/cfg/settings.toml
run: |
  set -e
  test "$(stat -c %a ~/.ssh/sky-key)" = 600
  grep -q lr=0.1 ~/cfg/settings.toml
  grep -q cat "$SPOTBROKER_MOUNT_ROOT/inputs/labels.csv"
  echo "step-42 written by $SKYPILOT_TASK_ID" > ~/checkpoint/model.txt
  mkdir -p ~/checkpoint/nested && echo deep > ~/checkpoint/nested/x
  echo writer done
file_mounts:
  ~/.ssh/sky-key: ./key.txt
  ~/cfg: ./cfg
  /inputs: ./inputs
  ~/checkpoint:
    name: my-ckpts
    mode: MOUNT
"""

READER = """name: reader
run: |
  set -e
  cat ~/checkpoint/model.txt
  test "$(cat ~/checkpoint/nested/x)" = deep
  echo reader done
file_mounts:
  ~/checkpoint:
    name: my-ckpts
"""


def submit_file(settings, h, task: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    env.update(SPOTBROKER_URL=f"http://127.0.0.1:{settings.port}", SPOTBROKER_TOKEN=h["Authorization"].split()[1])
    return subprocess.run([sys.executable, "-m", "spotbroker.broker.cli", "submit", str(task), "--json"],
                          env=env, cwd=task.parent, capture_output=True, text=True, timeout=120)


def run_file(api, settings, h, task: Path) -> dict:
    done = submit_file(settings, h, task)
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = json.loads(done.stdout)["id"]
    job = wait_state(api, h, job_id, DONE, timeout=90)
    assert job["state"] == "SUCCEEDED", timeline(api, h, job_id) + api.get(f"/v1/jobs/{job_id}/logs", headers=h).text
    return job


def test_one_job_writes_a_named_bucket_and_the_next_reads_it_with_files_and_dirs_placed_before_setup(
        api, team_headers, settings, tmp_path):
    proj = tmp_path / "proj"
    (proj / "cfg").mkdir(parents=True)
    (proj / "inputs").mkdir()
    (proj / "cfg" / "settings.toml").write_text("lr=0.1\n")
    (proj / "inputs" / "labels.csv").write_text("cat,1\n")
    (proj / "key.txt").write_text("the key")
    (proj / "key.txt").chmod(0o600)
    (proj / "writer.yaml").write_text(WRITER)
    (proj / "reader.yaml").write_text(READER)
    h = team_headers("ml")

    writer = run_file(api, settings, h, proj / "writer.yaml")
    mounts = writer["spec"]["file_mounts"]
    assert mounts["~/.ssh/sky-key"]["file"] is True and "upload" in mounts["~/cfg"]
    assert mounts["~/checkpoint"] == {"name": "my-ckpts", "mode": "MOUNT"}
    assert "writer done" in api.get(f"/v1/jobs/{writer['id']}/logs", headers=h).text
    # The bucket lives in the team's own storage, for good: the job wrote it there.
    home = settings.data_dir / "checkpoints" / "ml" / "buckets" / "my-ckpts"
    assert (home / "model.txt").read_text().startswith("step-42 written by")

    reader = run_file(api, settings, h, proj / "reader.yaml")
    logs = api.get(f"/v1/jobs/{reader['id']}/logs", headers=h).text
    assert "step-42 written by" in logs and "reader done" in logs, logs

    # Another team's bucket of the same name is its own.
    other = team_headers("speech")
    theirs = run_file(api, settings, other, proj / "writer.yaml")
    assert (settings.data_dir / "checkpoints" / "speech" / "buckets" / "my-ckpts" / "model.txt").exists()
    assert theirs["id"] != writer["id"]
