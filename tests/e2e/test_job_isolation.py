"""A job's process sees nothing of the broker's: not its environment, not its
files. Run as a hostile tenant would, through the real server and the local
launcher (SQLite only: the database plays no part here)."""
from __future__ import annotations

import os
import shlex
import sys

import pytest
from conftest import ADMIN_TOKEN
from helpers import wait_for, wait_state

from spotbroker.broker.launch.local import DEFAULT_JOB_USER, SYSTEM_PATH, job_python_default

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
ROOT = os.geteuid() == 0
# What a broker is typically started with: every one of them must stay out of jobs.
BROKER_SECRETS = {
    "SPOTBROKER_ADMIN_TOKEN": ADMIN_TOKEN,
    "SPOTBROKER_DATABASE_URL": "postgresql://spotbroker:hunter2-db-password@db.internal/spotbroker",
    "SPOTBROKER_SECRET_KEY": "broker-signing-key-0b5e",
    "AWS_SECRET_ACCESS_KEY": "broker-aws-secret-9c1d",
    "AWS_ACCESS_KEY_ID": "AKIABROKERKEY",
}


@pytest.fixture
def settings(settings):
    """The embedded default: the SQLite database and the secret key inside the data directory."""
    settings.database_url = None
    settings.secret_key = None
    return settings


@pytest.fixture
def broker_env(monkeypatch):
    for name, value in BROKER_SECRETS.items():
        monkeypatch.setenv(name, value)


def run_job(api, headers, run: str, **spec) -> tuple[dict, str]:
    job_id = api.post("/v1/jobs", json={"name": "probe", "run": run, **spec}, headers=headers).json()["id"]
    job = wait_state(api, headers, job_id, {"SUCCEEDED", "FAILED"}, timeout=60)
    return job, api.get(f"/v1/jobs/{job_id}/logs", headers=headers).text


def test_a_job_that_prints_its_environment_sees_nothing_of_the_brokers(broker_env, api, team_headers, settings):
    h = team_headers("b")
    job, out = run_job(api, h, "env; echo; echo user=$(id -un)")
    assert job["state"] == "SUCCEEDED", out
    for name, value in BROKER_SECRETS.items():
        assert value not in out, f"{name} reached the job"
    env = dict(line.split("=", 1) for line in out.split("\n\n")[0].splitlines() if "=" in line)
    assert not {k for k in env if k.startswith("SPOTBROKER_")} - {
        "SPOTBROKER_JOB_ID", "SPOTBROKER_ATTEMPT_ID", "SPOTBROKER_CHECKPOINT_JOB_URI", "SPOTBROKER_URL",
        "SPOTBROKER_CLOUD", "SPOTBROKER_REGION", "SPOTBROKER_ZONE", "SPOTBROKER_INSTANCE_TYPE",
        "SPOTBROKER_CONTROL_DIR"}
    assert "SPOTBROKER_AGENT_TOKEN" not in env  # the agent's own: it keeps it from the trainer
    # The documented PATH: the jobs' interpreter first, then the system's.
    assert env["PATH"] == f"{os.path.dirname(job_python_default())}:{SYSTEM_PATH}"
    assert env["HOME"].startswith(str(settings.data_dir / "runs")) and env["LANG"] == "C.UTF-8"
    if ROOT:
        assert f"user={DEFAULT_JOB_USER}" in out


def test_the_admin_token_cannot_be_read_and_used_by_another_teams_job(broker_env, api, team_headers):
    team_headers("a")
    h = team_headers("b")
    _, out = run_job(api, h, 'echo "token=[$SPOTBROKER_ADMIN_TOKEN]"')
    leaked = out.split("token=[", 1)[1].split("]", 1)[0]
    r = api.post("/v1/teams/a/tokens", json={"name": "stolen"}, headers={"Authorization": f"Bearer {leaked or '-'}"})
    assert r.status_code == 401 and leaked == ""


@pytest.mark.skipif(not ROOT, reason="needs root: file modes protect nothing from a job of the broker's own "
                                      "user, and only root can run jobs as another")
def test_a_job_cannot_read_the_brokers_files_but_writes_its_own_prefix(broker_env, api, team_headers, settings):
    h = team_headers("b")
    data = settings.data_dir
    probes = {
        "secret_key": f"cat {shlex.quote(str(data / 'secret_key'))}",
        "database": f"head -c 100 {shlex.quote(str(data / 'spotbroker.db'))}",
        "list_data_dir": f"ls {shlex.quote(str(data))}",
        "logs": f"ls {shlex.quote(str(data / 'logs'))}",
        "list_runs": f"ls {shlex.quote(str(data / 'runs'))}",
        "list_checkpoints": f"ls {shlex.quote(str(data / 'checkpoints'))}",
    }
    script = "; ".join(f"if {cmd} >/dev/null 2>&1; then echo {name}=READ; else echo {name}=DENIED; fi"
                       for name, cmd in probes.items())
    script += '; prefix=$(echo $CHECKPOINT_URI | sed s,file://,,); echo hi > "$prefix/x" && echo own=WROTE'
    job, out = run_job(api, h, script)
    assert job["state"] == "SUCCEEDED", out
    for name in probes:
        assert f"{name}=DENIED" in out, out
    assert "own=WROTE" in out
    assert (data / "spotbroker.db").exists() and settings.signing_key()  # the broker's own, still its own
    mode = (data / "secret_key").stat().st_mode & 0o777
    assert mode == 0o600 and (data.stat().st_mode & 0o777) == 0o711


def test_the_job_interpreter_is_defined_not_the_brokers_path(broker_env, api, team_headers, monkeypatch):
    """`python` in a job's run is the jobs' interpreter, whatever the PATH the
    broker itself was started with."""
    monkeypatch.setenv("PATH", "/nonexistent/bin:" + os.environ["PATH"])
    h = team_headers("b")
    job, out = run_job(api, h, "command -v python; python -c 'import spotbroker.agent.checkpoint; print(\"lib-ok\")'")
    assert job["state"] == "SUCCEEDED", out
    assert out.splitlines()[0] == os.path.join(os.path.dirname(job_python_default()), "python")
    assert "lib-ok" in out and sys.executable  # the library is importable there


@pytest.mark.skipif(not ROOT, reason="needs root: only root can run jobs as another user than the broker's")
def test_a_job_cannot_read_another_attempts_output_or_its_simulated_cloud(broker_env, api, team_headers, settings):
    """The run directory's files are the broker's: a job of another team that
    guesses an attempt id reads neither its raw output nor where its
    simulated metadata service listens (whose notices it could send)."""
    a, b = team_headers("a"), team_headers("b")
    job_id = api.post("/v1/jobs", json={"name": "victim", "run": "echo A-PRIVATE-LINE; sleep 60",
                                        "resources": {"accelerators": "T4:1"}}, headers=a).json()["id"]
    job = wait_state(api, a, job_id, {"RUNNING"}, timeout=60)
    run_dir = settings.data_dir / "runs" / str(job["attempts"][0]["id"])
    wait_for(lambda: (run_dir / "sim.url").exists() and b"A-PRIVATE-LINE" in (run_dir / "node-0.out").read_bytes(),
             timeout=30, what="the victim's output")
    probes = {name: f"cat {shlex.quote(str(run_dir / name))}" for name in ("node-0.out", "sim.url", "sim.log")}
    script = "; ".join(f"if {cmd} >/dev/null 2>&1; then echo {name}=READ; else echo {name}=DENIED; fi"
                       for name, cmd in probes.items())
    _, out = run_job(api, b, script)
    api.post(f"/v1/jobs/{job_id}/cancel", headers=a)
    for name in probes:
        assert f"{name}=DENIED" in out, out
