"""The preemption loop for jobs as users write them.

Each test submits one realistic shape of job (a `cd`, a `setup` step, the
trainer as a grandchild, each cloud's notice protocol, a trainer without the
checkpoint library, code uploaded as a workdir over REST or by `spotbroker
submit` from a SkyPilot task file), preempts it through the metadata simulator once it is
stepping, and checks the whole promise: the flush is committed before the
notice's deadline, the next attempt resumes at that step, the run ends with
the loss of an uninterrupted one, and nothing is written into the job's
working directory but what the job itself wrote. SQLite only: the database
side of recovery runs on both elsewhere; this is the node side.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import pytest
from support.helpers import once_per_run, timeline, wait_for, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]
REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "train.py"
PLAIN = Path(__file__).with_name("plain_trainer.py")
ARGS = "--steps 50 --seed 5 --every-steps 1000 --log-every 1"


def final_loss(text: str) -> str:
    return re.findall(r"final_loss=(\S+)", text)[-1]


def uninterrupted(script: Path, args: str) -> str:
    done = subprocess.run([sys.executable, str(script), *shlex.split(args)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return final_loss(done.stdout)


@pytest.fixture(scope="module")
def uninterrupted_loss(tmp_path_factory) -> str:
    """The final loss of TRAIN with ARGS, never stopped: the same for every
    test here, so computed once (each run is a torch start, about 3 s)."""
    return once_per_run(tmp_path_factory, "job-shapes-loss", lambda: uninterrupted(TRAIN, ARGS))


def preempt_once_stepping(api, h, job_id: int) -> dict:
    try:
        wait_state(api, h, job_id, {"RUNNING"}, timeout=60)
    except AssertionError:
        raise AssertionError(api.get(f"/v1/jobs/{job_id}/events", headers=h).text) from None
    wait_for(lambda: "step=5 " in api.get(f"/v1/jobs/{job_id}/logs", headers=h).text, timeout=60,
             what="training to be under way")
    r = api.post(f"/v1/jobs/{job_id}/simulate-preemption", headers=h)
    assert r.status_code == 202, r.text
    job = wait_state(api, h, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=150)
    assert job["state"] == "SUCCEEDED", timeline(api, h, job_id)
    return job


def node_workdir(settings, attempt_id: int) -> Path:
    return Path(settings.data_dir) / "runs" / str(attempt_id) / "node-0" / "workdir"


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def assert_flushed_and_resumed(api, h, job: dict, cloud: str | None = None) -> None:
    """The flush committed inside the notice's window, under the first
    attempt's prefix, and the second attempt resumed exactly there (on the
    given cloud's notice protocol; None: wherever placement put it)."""
    first, second = job["attempts"]
    cloud = cloud or first["cloud"]
    assert (first["state"], first["reason"], first["cloud"]) == ("PREEMPTED", "preempted", cloud)
    events = api.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["events"]
    notice = next(e for e in events if e["type"] == "preemption_notice")
    assert notice["data"]["cloud"] == cloud
    committed = [e for e in events if e["type"] == "checkpoint_committed" and e["attempt_id"] == first["id"]]
    assert committed, [e["type"] for e in events]
    flush = committed[-1]
    assert datetime.fromisoformat(flush["data"]["agent_at"]) <= datetime.fromisoformat(notice["data"]["deadline"])
    assert f"/{first['id']}/step-" in flush["data"]["uri"]
    resumed = next(e for e in events if e["type"] == "resumed" and e["attempt_id"] == second["id"])
    assert resumed["data"]["step"] == flush["data"]["step"] > 0
    logs = api.get(f"/v1/jobs/{job['id']}/logs", params={"attempt": second["id"]}, headers=h).text
    assert f"start_step={flush['data']['step']}" in logs


def copy_in(*paths: Path, into: str = ".") -> str:
    """A `setup` that brings the trainer into the node's fresh working directory."""
    return f"mkdir -p {into} && cp {' '.join(shlex.quote(str(p)) for p in paths)} {into}/"


GPU = {"aws": "V100:1", "gcp": "L4:1", "azure": "V100:1"}  # GCP's catalog attaches no V100 or T4
SHAPES = {
    # run: cd sub && python train.py, after a setup step (as SkyPilot tasks do); GCP's notice
    "cd-after-setup": ("gcp", {"setup": copy_in(TRAIN, into="sub"),
                               "run": f"cd sub && python train.py {ARGS} --step-seconds 0.15"}, {"sub/train.py"}),
    # the trainer as a grandchild of the agent: bash -c -> python; Azure's notice
    "bash-grandchild": ("azure", {"setup": copy_in(TRAIN),
                                  "run": f"bash -c {shlex.quote(f'python train.py {ARGS} --step-seconds 0.15')}"},
                        {"train.py"}),
    # a relative command in the working directory; AWS's notice
    "relative-run": ("aws", {"setup": copy_in(TRAIN, into="examples"),
                             "run": f"python examples/train.py {ARGS} --step-seconds 0.15"}, {"examples/train.py"}),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_job_shape_flushes_on_notice_and_resumes_where_it_stopped(api, team_headers, settings, shape,
                                                                    uninterrupted_loss):
    cloud, spec, files = SHAPES[shape]
    h = team_headers()
    resources = {"accelerators": GPU[cloud], "infra": cloud}
    job_id = api.post("/v1/jobs", json={"name": shape, **spec, "resources": resources}, headers=h).json()["id"]
    job = preempt_once_stepping(api, h, job_id)
    assert_flushed_and_resumed(api, h, job, cloud)
    assert final_loss(api.get(f"/v1/jobs/{job_id}/logs", headers=h).text) == uninterrupted_loss
    for attempt in job["attempts"]:  # the job's tree holds what the job put there, nothing of the agent's
        assert files_under(node_workdir(settings, attempt["id"])) == files


def test_a_trainer_without_the_library_restarts_from_the_newest_committed_checkpoint(api, team_headers, settings,
                                                                                  job_scratch):
    """No library: the agent says so at the notice, nothing is flushed, and
    the next attempt starts from the newest committed checkpoint (none here:
    step 0). The agent writes nothing into the job's tree."""
    h = team_headers()
    # The first attempt trains until the notice's deadline ends it (a short
    # run could finish first under load: one attempt, no restart to see).
    marker = job_scratch / "first-attempt"
    run = (f"if [ -e {marker} ]; then steps=40; else touch {marker}; steps=4000; fi; "
           "python plain_trainer.py --steps $steps --step-seconds 0.15")
    job_id = api.post("/v1/jobs", json={"name": "plain", "setup": copy_in(PLAIN), "run": run,
                                        "resources": {"accelerators": "T4:1", "infra": "aws"}},
                      headers=h).json()["id"]
    job = preempt_once_stepping(api, h, job_id)
    first, second = job["attempts"]
    events = api.get(f"/v1/jobs/{job_id}/events", headers=h).json()["events"]
    no_flush = next(e for e in events if e["type"] == "no_flush")
    assert "does not use the checkpoint library" in no_flush["data"]["reason"]
    assert not [e for e in events if e["type"] in ("checkpoint_committed", "resumed")]
    assert api.get(f"/v1/jobs/{job_id}/checkpoints", headers=h).json()["checkpoints"] == []
    second_log = api.get(f"/v1/jobs/{job_id}/logs", params={"attempt": second["id"]}, headers=h).text
    assert "start_step=0" in second_log and f"final_loss={_plain_final(40)}" in second_log
    for attempt in (first, second):
        assert files_under(node_workdir(settings, attempt["id"])) == {"plain_trainer.py"}


def _plain_final(steps: int) -> int:
    state = 7
    for step in range(steps):
        state = (state * 31 + step) % 1_000_003
    return state


# --- code uploaded as a workdir ----------------------------------------------------

STEP = "--step-seconds 0.15"


@pytest.fixture
def project():
    """A user's project as it sits on their laptop: the trainer twice (for a
    relative run and for `cd sub`), a .gitignore'd data directory, and a
    .venv that must not travel. Yields (root, the files that should travel)."""
    root = Path(tempfile.mkdtemp(prefix="spotbroker-project-"))
    try:
        (root / "examples").mkdir()
        (root / "sub").mkdir()
        shutil.copy(TRAIN, root / "examples" / "train.py")
        shutil.copy(TRAIN, root / "sub" / "train.py")
        (root / "data").mkdir()
        (root / "data" / "big.bin").write_bytes(os.urandom(1 << 16))
        (root / ".venv").mkdir()
        (root / ".venv" / "pyvenv.cfg").write_text("home = /nowhere\n")
        (root / ".gitignore").write_text("data/\n.venv/\n__pycache__/\n")
        yield root, {"examples/train.py", "sub/train.py", ".gitignore"}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def upload_over_rest(api, h, root: Path) -> str:
    """What a REST client does: pack, PUT /v1/uploads/{sha256}."""
    from spotbroker.broker.jobs.workdir import pack

    with tempfile.TemporaryFile() as archive:
        sha = pack(root, archive).sha256
        archive.seek(0)
        r = api.put(f"/v1/uploads/{sha}", content=archive.read(), headers={**h, "Content-Type": "application/gzip"})
    assert r.status_code == 201, r.text
    return sha


def submit_file(settings, h, task: Path) -> int:
    """`spotbroker submit FILE`, run as a user runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    env.update(SPOTBROKER_URL=f"http://127.0.0.1:{settings.port}",
               SPOTBROKER_TOKEN=h["Authorization"].split()[1])
    done = subprocess.run([sys.executable, "-m", "spotbroker.broker.cli", "submit", str(task), "--json"],
                          env=env, cwd=task.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["id"]


def check_uploaded_run(api, h, settings, job_id: int, root: Path, files: set[str], cloud: str | None,
                       uninterrupted_loss: str) -> None:
    before = files_under(root)
    job = preempt_once_stepping(api, h, job_id)
    assert_flushed_and_resumed(api, h, job, cloud)
    assert final_loss(api.get(f"/v1/jobs/{job_id}/logs", headers=h).text) == uninterrupted_loss
    for attempt in job["attempts"]:  # a fresh copy each attempt: the uploaded files, what the job made
        assert files_under(node_workdir(settings, attempt["id"])) == files
    assert files_under(root) == before  # nothing lands in the user's own tree


UPLOADED = {
    # an uploaded workdir and a relative command in it; AWS's notice
    "uploaded-relative-run": ("aws", None, f"python examples/train.py {ARGS} {STEP}", set()),
    # cd into a directory of the upload, after a setup step that writes there; GCP's notice
    "uploaded-cd-after-setup": ("gcp", "mkdir -p sub/out && echo ready > sub/out/setup.txt",
                                f"cd sub && python train.py {ARGS} {STEP}", {"sub/out/setup.txt"}),
}


@pytest.mark.parametrize("shape", UPLOADED)
def test_an_uploaded_workdir_is_each_attempts_working_directory(api, team_headers, settings, project, shape,
                                                               uninterrupted_loss):
    cloud, setup, run, made = UPLOADED[shape]
    root, files = project
    h = team_headers()
    sha = upload_over_rest(api, h, root)
    spec = {"name": shape, "workdir": {"upload": sha}, "run": run,
            "resources": {"accelerators": GPU[cloud], "infra": cloud}}
    if setup:
        spec["setup"] = setup
    r = api.post("/v1/jobs", json=spec, headers=h)
    assert r.status_code == 201, r.text
    check_uploaded_run(api, h, settings, r.json()["id"], root, files | made, cloud, uninterrupted_loss)


SKYPILOT_TASKS = {
    # SkyPilot task files as users write them, next to their code: `workdir: .`
    "task-relative-run": ("python --version", f"python examples/train.py {ARGS} {STEP}", set()),
    "task-cd-after-setup": ("mkdir -p sub/out && echo ready > sub/out/setup.txt",
                            f"cd sub && python train.py {ARGS} {STEP}", {"sub/out/setup.txt"}),
}


@pytest.mark.parametrize("shape", SKYPILOT_TASKS)
def test_a_skypilot_task_file_submitted_with_its_workdir(api, team_headers, settings, project, shape,
                                                        uninterrupted_loss):
    setup, run, made = SKYPILOT_TASKS[shape]
    root, files = project
    task = root / "task.yaml"
    task.write_text(f"name: {shape}\n"
                    "workdir: .\n"
                    f"setup: {setup}\n"
                    f"run: {run}\n"
                    "resources:\n"
                    "  accelerators: T4:1\n"
                    "  use_spot: true\n")
    h = team_headers()
    job_id = submit_file(settings, h, task)
    assert api.get(f"/v1/jobs/{job_id}", headers=h).json()["spec"]["workdir"]["upload"]
    check_uploaded_run(api, h, settings, job_id, root, files | {"task.yaml"} | made, None, uninterrupted_loss)
