"""`spotbroker submit`'s launch flags (SkyPilot's): --env/--secret complete
a file's `envs: {KEY: }` / `secrets: {KEY: }` (the caller's $KEY when no
value is given), --env-file, and --name/--gpus/--num-nodes/--use-spot/--infra
override the file as `sky launch` does: the Task the broker stores equals
the one SkyPilot makes of the same file and flags. The CLI runs as a user
runs it, against the real API on a socket."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spotbroker.broker.jobs.overrides import LaunchFlags, apply
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.launch.skypilot.task import task_from_spec
from spotbroker.broker.usecases import taskyaml

sky = pytest.importorskip("sky", reason="SkyPilot (the broker extra) is not installed")
SECRET = "wandb-s3cr3t-9f8e7d"
TOKEN = "hf-t0ken-from-the-shell"


def submit(args: list[str], tmp_path: Path, url: str = "http://127.0.0.1:9", token: str = "sbt_x",
           extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    env.update(HOME=str(tmp_path / "home"), SPOTBROKER_TOKEN=token, SPOTBROKER_URL=url, **(extra_env or {}))
    return subprocess.run([sys.executable, "-m", "spotbroker.broker.cli", "submit", *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


def connect(api, team_headers) -> tuple[str, str, dict[str, str]]:
    h = team_headers()
    return str(api.base_url), h["Authorization"].removeprefix("Bearer "), h


LEFT_TO_LAUNCH = """name: finetune
resources:
  use_spot: true
  accelerators: A10G:1
envs:
  HF_TOKEN:
  EPOCHS: 3
secrets:
  WANDB_API_KEY:
run: python train.py
"""


def test_values_left_to_the_launch_are_refused_naming_the_flag(api, team_headers, tmp_path):
    url, token, h = connect(api, team_headers)
    task = tmp_path / "task.yaml"
    task.write_text(LEFT_TO_LAUNCH)
    r = submit([str(task)], tmp_path, url, token)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "line 6: envs.HF_TOKEN" in r.stderr and "--env HF_TOKEN" in r.stderr, r.stderr
    assert "line 9: secrets.WANDB_API_KEY" in r.stderr and "--secret WANDB_API_KEY" in r.stderr
    assert api.get("/v1/jobs", headers=h).json()["jobs"] == []


def test_env_and_secret_flags_complete_the_file(api, team_headers, tmp_path):
    url, token, h = connect(api, team_headers)
    task = tmp_path / "task.yaml"
    task.write_text(LEFT_TO_LAUNCH)
    r = submit([str(task), "--env", "HF_TOKEN", "--env", "EPOCHS=5", "--secret", f"WANDB_API_KEY={SECRET}",
                "--json"], tmp_path, url, token, {"HF_TOKEN": TOKEN})
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert job["spec"]["envs"] == {"HF_TOKEN": TOKEN, "EPOCHS": "5"}
    assert job["spec"]["secrets"] == ["WANDB_API_KEY"]
    assert SECRET not in r.stdout + r.stderr
    assert SECRET not in api.get(f"/v1/jobs/{job['id']}", headers=h).text
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


def test_an_env_file_fills_envs_and_the_declared_secrets(api, team_headers, tmp_path):
    url, token, h = connect(api, team_headers)
    task, dotenv = tmp_path / "task.yaml", tmp_path / ".env"
    task.write_text(LEFT_TO_LAUNCH)
    dotenv.write_text(f"# keys\nexport HF_TOKEN={TOKEN}\nWANDB_API_KEY='{SECRET}'\nEPOCHS=7\n")
    r = submit([str(task), "--env-file", str(dotenv), "--env", "EPOCHS=9", "--json"], tmp_path, url, token)
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert job["spec"]["envs"] == {"HF_TOKEN": TOKEN, "EPOCHS": "9"}  # --env wins over the file
    assert job["spec"]["secrets"] == ["WANDB_API_KEY"] and SECRET not in r.stdout + r.stderr
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)


@pytest.mark.parametrize("args, says", [
    (["--env", "NOT_SET_ANYWHERE_42"], "NOT_SET_ANYWHERE_42 is not set in your environment"),
    (["--secret", "1BAD=x"], "is not a variable name"),
    (["--env-file", "/nonexistent/.env"], "does not exist"),
    (["--num-nodes", "0"], "--num-nodes"),
])
def test_a_bad_flag_is_named_before_any_request(tmp_path, args, says):
    task = tmp_path / "task.yaml"
    task.write_text("run: x\nresources: {use_spot: true}\n")
    r = submit([str(task), *args], tmp_path)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr


MULTI = """name: multi
num_nodes: 1
resources:
  use_spot: false
  any_of:
    - {infra: aws, accelerators: A10G:1}
    - {infra: gcp, accelerators: L4:1, use_spot: true}
run: python train.py
"""


def test_resource_flags_override_every_alternative(api, team_headers, tmp_path):
    url, token, h = connect(api, team_headers)
    task = tmp_path / "task.yaml"
    task.write_text(MULTI)
    r = submit([str(task), "--name", "renamed", "--gpus", "H100:8", "--num-nodes", "2", "--use-spot", "--json",
                "-y"], tmp_path, url, token)
    assert r.returncode == 0, r.stderr
    spec = json.loads(r.stdout)["spec"]
    assert (spec["name"], spec["num_nodes"]) == ("renamed", 2)
    assert [(a["infra"], a["accelerators"], a["use_spot"]) for a in spec["resources"]["any_of"]] == [
        ("aws", "H100:8", True), ("gcp", "H100:8", True)]
    api.post(f"/v1/jobs/{json.loads(r.stdout)['id']}/cancel", headers=h)


def test_a_flags_mistake_is_the_flags_not_a_line_of_the_file(api, team_headers, tmp_path):
    url, token, _ = connect(api, team_headers)
    task = tmp_path / "task.yaml"
    task.write_text(MULTI)
    for gpus, says in (("H10:8", "did you mean"), ("A100:0", "A100")):
        r = submit([str(task), "--gpus", gpus, "-y"], tmp_path, url, token)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        told = [line for line in r.stderr.splitlines() if line.startswith(f"  --gpus {gpus}: ")]
        assert len(told) == 1 and says in told[0], r.stderr  # once, for every alternative it set
        assert "line " not in r.stderr, r.stderr  # (each alternative's line was blamed)


def test_variables_fill_in_the_workdir_and_the_mounts_as_skypilot_reads_them(api, team_headers, tmp_path):
    url, token, h = connect(api, team_headers)
    for sub in ("a", "b"):
        (tmp_path / "proj" / sub).mkdir(parents=True)
        (tmp_path / "proj" / sub / "train.py").write_text(f"print('{sub}')\n")
    task = tmp_path / "task.yaml"
    task.write_text("envs:\n  SUB: a\n  BUCKET: ckpts\nworkdir: ./proj/${SUB}\nfile_mounts:\n"
                    "  /mnt/$SUB: ./proj/${SUB}\n  /data:\n    name: ${BUCKET}-$SUB\nrun: python train.py\n")
    r = submit([str(task), "--env", "SUB=b", "--json"], tmp_path, url, token)  # (was: ./proj/${SUB} does not exist)
    assert r.returncode == 0, r.stderr
    spec = json.loads(r.stdout)["spec"]
    assert set(spec["workdir"]) == {"upload"} and set(spec["file_mounts"]) == {"/mnt/b", "/data"}, spec
    assert spec["file_mounts"]["/data"]["name"] == "ckpts-b" and spec["envs"]["SUB"] == "b"
    api.post(f"/v1/jobs/{json.loads(r.stdout)['id']}/cancel", headers=h)


def test_a_secrets_value_is_never_filled_into_a_path_or_a_name():
    from spotbroker.broker.jobs.overrides import fill_in_variables

    doc = {"envs": {"SUB": "a"}, "secrets": {"TOK": "s3cr3t"}, "workdir": "./${SUB}/$TOK",
           "file_mounts": {"/ck": {"name": "bk-${TOK}"}}, "run": "echo $SUB"}
    assert fill_in_variables(doc) == {**doc, "workdir": "./a/$TOK"}  # (a path and a name are stored and shown)


def test_a_json_spec_takes_the_same_flags(api, team_headers, tmp_path):
    url, token, h = connect(api, team_headers)
    task = tmp_path / "job.json"
    task.write_text(json.dumps({"name": "j", "run": "x", "resources": {"accelerators": "A10G:1"}}))
    r = submit([str(task), "--infra", "aws/us-west-2", "--no-use-spot", "--env", "A=1", "--json"],
               tmp_path, url, token)
    assert r.returncode == 0, r.stderr
    spec = json.loads(r.stdout)["spec"]
    assert (spec["resources"]["infra"], spec["resources"]["use_spot"], spec["envs"]) == (
        "aws/us-west-2", False, {"A": "1"})
    api.post(f"/v1/jobs/{json.loads(r.stdout)['id']}/cancel", headers=h)


def test_the_cli_prints_what_was_dropped(api, team_headers, tmp_path):
    url, token, h = connect(api, team_headers)
    task = tmp_path / "task.yaml"
    task.write_text("run: x\nresources:\n  use_spot: true\n  any_of:\n    - {infra: lambda, accelerators: H100:1}\n"
                    "    - {infra: aws, accelerators: H100:1}\n")
    r = submit([str(task)], tmp_path, url, token)
    assert r.returncode == 0, r.stderr
    assert f"{task}:5: warning: resources.any_of.0: spotbroker does not place on lambda" in r.stderr, r.stderr
    job_id = r.stdout.split()[2]
    api.post(f"/v1/jobs/{job_id}/cancel", headers=h)


def _resources(task) -> list[dict]:
    """The resource sets, each once (SkyPilot keeps two alternatives made
    equal by an override; they mean one)."""
    return sorted({json.dumps({"cloud": str(r.cloud).lower() if r.cloud else None, "region": r.region,
                    "accelerators": r.accelerators, "use_spot": r.use_spot}, default=str, sort_keys=True)
                   for r in task.resources})


@pytest.mark.parametrize("text", [MULTI, "run: x\nresources: {accelerators: {A10G: 1, L4: 1}, infra: aws}\n",
                                  "run: x\nresources: {accelerators: [H100:8, A100:8], use_spot: true}\n"])
@pytest.mark.parametrize("flags", [
    LaunchFlags(gpus="A100:8"), LaunchFlags(infra="gcp/us-central1", use_spot=True),
    LaunchFlags(gpus="H100:1", infra="azure", use_spot=False, num_nodes=3, name="n"),
])
def test_the_flags_mean_what_they_mean_to_skypilot(text, flags):
    """Ours: the flags applied to the document, read, stored, made a Task.
    SkyPilot's: the file read, then `sky launch`'s own overrides."""
    from sky.utils import infra_utils, registry

    ours = task_from_spec(JobSpec.model_validate(taskyaml.to_spec(apply(yaml.safe_load(text), flags))))
    theirs = sky.Task.from_yaml_config(yaml.safe_load(text))
    override: dict = {}
    if flags.gpus:
        override["accelerators"] = flags.gpus
    if flags.use_spot is not None:
        override["use_spot"] = flags.use_spot
    if flags.infra:
        info = infra_utils.InfraInfo.from_str(flags.infra)
        override.update(cloud=registry.CLOUD_REGISTRY.from_str(info.cloud), region=info.region, zone=info.zone)
    theirs.set_resources_override(override)
    if flags.num_nodes:
        theirs.num_nodes = flags.num_nodes
    if flags.name:
        theirs.name = flags.name
    assert _resources(ours) == _resources(theirs)
    assert ours.num_nodes == theirs.num_nodes and (flags.name is None or ours.name == theirs.name)
