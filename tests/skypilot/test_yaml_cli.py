"""`spotbroker submit task.yaml`: says once that a file without use_spot runs
on-demand (of a job the broker took); uploads local file mount directories; names file, line and field
of what the broker refuses."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def submit(task: Path, tmp_path: Path, url: str = "http://127.0.0.1:9", token: str = "sbt_x"):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    env.update(HOME=str(tmp_path / "home"), SPOTBROKER_TOKEN=token, SPOTBROKER_URL=url)
    return subprocess.run([sys.executable, "-m", "spotbroker.broker.cli", "submit", str(task)], env=env,
                          cwd=task.parent, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("text, says", [
    ("run: x\nresources: {accelerators: A10G:1}\n", True),
    ("run: x\nresources: {accelerators: A10G:1, use_spot: true}\n", False),
    ("run: x\nresources: {any_of: [{accelerators: L4, use_spot: true}, {accelerators: T4, use_spot: false}]}\n",
     False),
    # a Kubernetes alternative has no spot: the cloud one says (examples/skypilot/kubernetes_first.yaml; was told)
    ("run: x\nresources: {ordered: [{infra: k8s/lab-a, accelerators: H100:8}, {accelerators: H100:8, "
     "use_spot: true}]}\n", False),
    ("run: x\nresources: {ordered: [{infra: k8s, accelerators: H100:8}, {accelerators: H100:8}]}\n", True),
])
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_file_without_use_spot_is_said_to_run_on_demand_once(api, team_headers, tmp_path, text, says):
    url, h = str(api.base_url), team_headers()
    task = tmp_path / "task.yaml"
    task.write_text(text.replace("run: x", "run: 'true'"))
    r = submit(task, tmp_path, url, h["Authorization"].removeprefix("Bearer "))
    assert r.returncode == 0 and "submitted job" in r.stdout, r.stderr
    assert r.stderr.count("runs on on-demand") == (1 if says else 0), r.stderr
    api.post(f"/v1/jobs/{r.stdout.split()[2]}/cancel", headers=h)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_refused_file_is_not_said_to_run_anywhere(api, team_headers, tmp_path):
    """The on-demand notice came before the broker's answer: a refused file was told where it would run."""
    url, token = str(api.base_url), team_headers()["Authorization"].removeprefix("Bearer ")
    task = tmp_path / "task.yaml"
    task.write_text("run: x\nresources: {accelerators: A10G:1, disk_tier: fastest}\n")
    r = submit(task, tmp_path, url, token)
    assert r.returncode == 1 and "resources.disk_tier" in r.stderr and "Traceback" not in r.stderr
    assert "on-demand" not in r.stderr, r.stderr


def test_a_local_mount_that_is_no_directory_is_named(tmp_path):
    task = tmp_path / "task.yaml"
    task.write_text("run: x\nresources: {use_spot: true}\nfile_mounts:\n  /data: ./missing\n")
    r = submit(task, tmp_path)
    assert r.returncode == 1 and "file_mounts./data" in r.stderr and str(tmp_path / "missing") in r.stderr


def test_the_refusal_names_file_line_and_field(api, team_headers, tmp_path):
    url, token = str(api.base_url), team_headers()["Authorization"].removeprefix("Bearer ")
    task = tmp_path / "task.yaml"
    task.write_text("name: t\nrun: x\nresources:\n  use_spot: true\n  acceleratorz: A100:1\n")
    r = submit(task, tmp_path, url, token)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"{task}:" in r.stderr and "line 5: resources.acceleratorz" in r.stderr
    assert "did you mean 'accelerators'?" in r.stderr


@pytest.mark.parametrize("resources", ["T4:1", "[T4]", "{any_of: []}", "{accelerators: []}"])
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_refusal_of_resources_as_a_whole_names_file_line_and_field(api, team_headers, tmp_path, resources):
    """The CLI crashed with a traceback (IndexError in overrides.flag_of) on
    every refusal of the `resources` key itself, a common mistake."""
    url, token = str(api.base_url), team_headers()["Authorization"].removeprefix("Bearer ")
    task = tmp_path / "task.yaml"
    task.write_text(f"name: t\nrun: x\nresources: {resources}\n")
    r = submit(task, tmp_path, url, token)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{task}:" in r.stderr and "line 3: resources" in r.stderr, r.stderr


def test_what_the_broker_refuses_first_is_told_before_the_workdir_is_packed(tmp_path):
    """A file refused for an unset `--env` had its workdir packed and uploaded first."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    task = tmp_path / "task.yaml"
    task.write_text("workdir: ./code\nenvs:\n  HF_TOKEN:\nrun: python train.py\n")
    r = submit(task, tmp_path)  # (no broker at that address: nothing may be sent)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "line 3: envs.HF_TOKEN: give its value: `spotbroker submit --env HF_TOKEN=VALUE FILE`" in r.stderr
    assert "uploading" not in r.stderr and "cannot reach the broker" not in r.stderr, r.stderr


def test_a_relative_mount_path_is_refused_at_its_line_before_anything_is_uploaded(tmp_path):
    """SkyPilot puts `data: ./data` under the workdir; a node here places mounts at absolute or ~/ paths.
    Refused with what to write instead, at the mount's own line, before the workdir is packed (it was
    refused by the broker after the uploads, at `file_mounts:`'s line)."""
    (tmp_path / "data").mkdir()
    task = tmp_path / "task.yaml"
    task.write_text("run: ls data\nworkdir: .\nfile_mounts:\n  /ok: s3://bucket/x\n  data: ./data\n")
    r = submit(task, tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "uploading" not in r.stderr, r.stderr
    assert "line 5: file_mounts.data: 'data': a remote path is absolute or starts with ~/" in r.stderr, r.stderr
    assert "mount it at ~/data and `ln -s ~/data data` in run" in r.stderr, r.stderr
