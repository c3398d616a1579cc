"""What a SkyPilot node runs, run for real on this machine.

moto starts no machine, so SkyPilot never gets past SSH against it (see
test_launch_moto.py). Here the SDK boundary is replaced from SSH on, and
only there: `NodeSky.launch` does what SkyPilot does once the node answers
(copies the `file_mounts` to the node's home, runs `setup` then `run` with
the task's `envs` and `secrets` and SKYPILOT_* variables) and then answers
`api_status`/`get`/`status`/`job_status` as SkyPilot would for that node.
Everything else is real: the Task is built by the launcher with SkyPilot's
own classes against the hand-placed catalog; the node is a fresh virtualenv
of the base interpreter that installs the broker's wheelhouse with no
package index, fetches the uploaded code, and runs the agent and a short
trainer that report to a real broker.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ADMIN_TOKEN
from support.helpers import tgz, wait_for
from support.skyenv import SkyAws

from spotbroker.broker.jobs.runs import RunState
from spotbroker.broker.pricing.offers import Placement

TRAINER = b"""import os, time
print("trainer up on", os.environ["SPOTBROKER_ZONE"], "epochs", os.environ["EPOCHS"], flush=True)
assert "SPOTBROKER_AGENT_TOKEN" not in os.environ, "the agent keeps its token from the trainer"
time.sleep(2)
print("trainer done", flush=True)
"""


class NodeSky:
    """SkyPilot's SDK with what it returns after SSH replaced by running the node here."""

    # Every call that would reach SkyPilot's API server is answered here: the
    # launcher's health check has no server to ask (as with any SDK stand-in).
    api_info = None

    def __init__(self, sky, node_home: Path) -> None:
        self._sky, self.home = sky, node_home
        self.runs: dict[str, subprocess.Popen] = {}
        self.outputs: dict[str, Path] = {}

    def __getattr__(self, name):
        return getattr(self._sky, name)

    def launch(self, task, cluster_name: str, **_):
        for remote, local in task.file_mounts.items():  # SkyPilot's rsync of file_mounts
            shutil.copytree(local, self.home / remote.removeprefix("~/"), dirs_exist_ok=True)
        env = {"HOME": str(self.home), "PATH": f"{Path(sys.base_prefix) / 'bin'}:/usr/bin:/bin",
               "LANG": "C.UTF-8", **task.envs,
               **{k: v.get_secret_value() if hasattr(v, "get_secret_value") else v for k, v in task.secrets.items()},
               "SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "1", "SKYPILOT_NODE_IPS": "127.0.0.1"}
        script = f"( {task.setup}\n) || exit $?\n( {task.run}\n)"
        out = self.home / f"{cluster_name}.out"
        with open(out, "wb") as sink:
            proc = subprocess.Popen(["bash", "-c", script], env=env, cwd=str(self.home), stdout=sink,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        request_id = uuid.uuid4().hex
        self.runs[request_id], self.outputs[request_id] = proc, out
        return request_id

    def api_status(self, request_ids=None, **_):
        return [SimpleNamespace(request_id=r, status="SUCCEEDED", name="sky.launch", cluster_name=None)
                for r in request_ids or [] if r in self.runs]

    def get(self, request_id):
        if isinstance(request_id, tuple):  # status / job_status below answer directly
            return request_id[1]
        return 1, None

    def status(self, cluster_names=None, **_):
        return ("status", [{"name": n, "status": "UP"} for n in cluster_names or []])

    def job_status(self, cluster_name, job_ids):
        proc = next(iter(self.runs.values()))
        code = proc.poll()
        return ("job_status", {1: "RUNNING" if code is None else ("SUCCEEDED" if code == 0 else "FAILED")})

    def stop(self) -> None:
        for proc in self.runs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            proc.wait(timeout=10)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_node_installs_the_wheel_fetches_the_code_and_reports_to_the_broker(
        sky_aws: SkyAws, agent_endpoint, settings, tmp_path: Path) -> None:
    import sky

    from spotbroker.broker.jobs.spec import JobSpec
    from spotbroker.broker.launch.request import launch_request
    from spotbroker.broker.launch.skypilot.launcher import SkyPilotLauncher
    from spotbroker.broker.launch.skypilot.wheel import wheelhouse
    from spotbroker.broker.reconciler import Reconciler
    from spotbroker.broker.store.db import make_engine, make_session_factory, transaction
    from spotbroker.broker.store.models import Attempt, Job

    api = agent_endpoint
    r = api.post("/v1/teams", json={"name": "ml"}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    h = {"Authorization": f"Bearer {r.json()['token']}"}
    # A module of the job's named like one the agent imports, on the job's
    # PYTHONPATH: the trainer's alone (it once failed the agent).
    archive = tgz(**{"train.py": TRAINER, "httpx.py": b"raise SystemExit('the job\\'s httpx.py ran in the agent')"})
    sha = hashlib.sha256(archive).hexdigest()
    assert api.put(f"/v1/uploads/{sha}", content=archive, headers={**h, "Content-Type": "application/gzip"}
                   ).status_code == 201
    r = api.post("/v1/jobs", headers=h, json={
        # (~/sky_workdir: where SkyPilot puts a task's workdir, which recipes cd to)
        "run": "cd ~/sky_workdir && python train.py", "envs": {"EPOCHS": "3", "PYTHONPATH": "."},
        "workdir": {"upload": sha},
        "resources": {"accelerators": "T4:1"}})
    assert r.status_code in (200, 201, 202), r.text
    job_id = r.json()["id"]

    engine = make_engine(settings.sqlalchemy_url)
    factory = make_session_factory(engine)
    node = NodeSky(sky, tmp_path / "node-home")
    launcher = SkyPilotLauncher(wheelhouse(tmp_path / "wheels"), prefix="sbnode", poll_s=0.2, cluster_poll_s=0.5,
                                sky=node)
    try:
        # What the reconciler commits before it launches: the attempt, in the place chosen.
        reconciler = Reconciler(factory, {"skypilot": launcher}, settings)
        where = Placement(cloud="aws", region="us-east-1", zone="us-east-1b", zone_id="use1-az1",
                          instance_type="g4dn.xlarge", accelerator="T4", accelerator_count=1, use_spot=True,
                          price_per_hour=0.2)
        with transaction(factory) as session:
            job = session.get(Job, job_id)
            attempt = reconciler.launching.new_attempt(session, job, JobSpec.model_validate(job.spec), where,
                                                       "skypilot", "t")
            attempt_id = attempt.id
        with factory() as session:
            request = launch_request(session, session.get(Attempt, attempt_id), settings, settings.signing_key())
        task = launcher.task(request)
        assert "SPOTBROKER_AGENT_TOKEN" in task.secrets and "SPOTBROKER_AGENT_TOKEN" not in task.envs
        handle = launcher.launch(request)

        def attempt_state() -> str:
            with factory() as session:
                return session.get(Attempt, attempt_id).state

        wait_for(lambda: attempt_state() == "RUNNING", timeout=180, interval=0.5)  # the agent's first word
        wait_for(lambda: launcher.status(handle).state == RunState.SUCCEEDED, timeout=120, interval=0.5)
        logs = api.get(f"/v1/jobs/{job_id}/logs", headers=h).text
        assert "trainer up on us-east-1b epochs 3" in logs and "trainer done" in logs, logs
        venv = node.home / ".spotbroker" / "venv"
        assert (venv / "bin" / "spotbroker").exists()
        installed = subprocess.run([str(venv / "bin" / "python"), "-c", "import spotbroker.agent, sys; "
                                    "print(spotbroker.agent.__file__)"], capture_output=True, text=True)
        assert str(venv) in installed.stdout, installed.stdout + installed.stderr
    finally:
        launcher.close()
        node.stop()
        engine.dispose()


MOUNTED = """set -e
test "$(cat ~/.ssh/sky-key)" = "the key" && test "$(stat -c %a ~/.ssh/sky-key)" = 600
grep -q lr=0.1 ~/cfg/settings.toml
echo "epoch 1" > ~/checkpoint/model.txt
echo mounts seen
"""


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_node_places_uploaded_files_and_directories_and_a_named_bucket_before_setup(
        sky_aws: SkyAws, agent_endpoint, settings, tmp_path: Path) -> None:
    """Uploaded mounts once never reached a SkyPilot node: the Task dropped
    them and nothing else fetched them. The node program places them (and a
    bucket of the team's by name, here on a file:// root) before `setup`."""
    import io
    import tarfile

    import sky

    from spotbroker.broker.launch.skypilot.launcher import SkyPilotLauncher
    from spotbroker.broker.launch.skypilot.wheel import wheelhouse

    api = agent_endpoint
    r = api.post("/v1/teams", json={"name": "ml"}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    h = {"Authorization": f"Bearer {r.json()['token']}"}
    key = io.BytesIO()  # what `spotbroker submit` packs for a single file: the file alone, its mode kept
    with tarfile.open(fileobj=key, mode="w:gz") as tar:
        info = tarfile.TarInfo("sky-key")
        info.size, info.mode = len(b"the key"), 0o600
        tar.addfile(info, io.BytesIO(b"the key"))
    uploads = {}
    for name, archive in (("key", key.getvalue()), ("cfg", tgz(**{"settings.toml": b"lr=0.1\n"}))):
        uploads[name] = hashlib.sha256(archive).hexdigest()
        assert api.put(f"/v1/uploads/{uploads[name]}", content=archive,
                       headers={**h, "Content-Type": "application/gzip"}).status_code == 201
    r = api.post("/v1/jobs", headers=h, json={
        "run": MOUNTED, "setup": "test -f ~/.ssh/sky-key && test -d ~/cfg && test -d ~/checkpoint",
        "resources": {"accelerators": "T4:1"},
        "file_mounts": {"~/.ssh/sky-key": {"upload": uploads["key"], "file": True},
                        "~/cfg": {"upload": uploads["cfg"]}, "~/checkpoint": {"name": "my-ckpts"}}})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    node = NodeSky(sky, tmp_path / "node-home")
    launcher = SkyPilotLauncher(wheelhouse(tmp_path / "wheels"), prefix="sbnode", poll_s=0.2, cluster_poll_s=0.5,
                                sky=node)
    try:
        attempt_id, request = _launch_request(settings, job_id)
        task = launcher.task(request)
        assert "spotbroker.agent.mounts" in task.setup and "~/cfg" not in task.file_mounts
        handle = launcher.launch(request)
        wait_for(lambda: launcher.status(handle).state in (RunState.SUCCEEDED, RunState.FAILED), timeout=180,
                 interval=0.5)
        out = next(iter(node.outputs.values())).read_text()
        assert launcher.status(handle).state == RunState.SUCCEEDED, out
        assert "mounts seen" in api.get(f"/v1/jobs/{job_id}/logs", headers=h).text
        bucket = settings.data_dir / "checkpoints" / "ml" / "buckets" / "my-ckpts"
        assert (bucket / "model.txt").read_text() == "epoch 1\n"
    finally:
        launcher.close()
        node.stop()


def _launch_request(settings, job_id: int):
    """The attempt the reconciler would commit, in one place, and its launch request."""
    from spotbroker.broker.jobs.spec import JobSpec
    from spotbroker.broker.launch.request import launch_request
    from spotbroker.broker.reconciler import Reconciler
    from spotbroker.broker.store.db import make_engine, make_session_factory, transaction
    from spotbroker.broker.store.models import Attempt, Job

    engine = make_engine(settings.sqlalchemy_url)
    factory = make_session_factory(engine)
    try:
        reconciler = Reconciler(factory, {}, settings)
        where = Placement(cloud="aws", region="us-east-1", zone="us-east-1b", zone_id="use1-az1",
                          instance_type="g4dn.xlarge", accelerator="T4", accelerator_count=1, use_spot=True,
                          price_per_hour=0.2)
        with transaction(factory) as session:
            job = session.get(Job, job_id)
            attempt = reconciler.launching.new_attempt(session, job, JobSpec.model_validate(job.spec), where,
                                                       "skypilot", "t")
            attempt_id = attempt.id
        with factory() as session:
            return attempt_id, launch_request(session, session.get(Attempt, attempt_id), settings,
                                              settings.signing_key())
    finally:
        engine.dispose()
