"""A job's process sees nothing of the broker's, nor of another team's jobs:
not their environment, not their files, not their processes; and its output
is bounded. Run as a hostile tenant would, through the real server and the
local launcher (SQLite only: the database plays no part here)."""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest
from conftest import ADMIN_TOKEN
from support.helpers import wait_for, wait_state
from support.ports import free_port

from spotbroker.agent import protocol
from spotbroker.broker.launch.local import SYSTEM_PATH, job_python_default
from spotbroker.broker.recovery.agent_channel import agent_token

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
ROOT = os.geteuid() == 0
LOG_BOUND = 64 * 1024
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
    """The embedded default: the SQLite database and the secret key inside the
    data directory; a log bound that a test's job reaches in a moment."""
    settings.database_url = None
    settings.secret_key = None
    settings.max_log_bytes = LOG_BOUND
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
    extra = {k for k in env if k.startswith("SPOTBROKER_")} - {
        "SPOTBROKER_JOB_ID", "SPOTBROKER_ATTEMPT_ID", "SPOTBROKER_CHECKPOINT_JOB_URI", "SPOTBROKER_URL",
        "SPOTBROKER_CLOUD", "SPOTBROKER_REGION", "SPOTBROKER_ZONE", "SPOTBROKER_INSTANCE_TYPE",
        "SPOTBROKER_CONTROL_DIR",
        # the job runs in a simulated cloud place (a CPU machine): its node's metadata simulator and notice window
        "SPOTBROKER_METADATA_URL", "SPOTBROKER_NOTICE_WINDOW"}
    assert not extra, extra
    assert "SPOTBROKER_AGENT_TOKEN" not in env  # the agent's own: it keeps it from the trainer
    # The documented PATH: the jobs' interpreter first, then the system's.
    assert env["PATH"] == f"{os.path.dirname(job_python_default())}:{SYSTEM_PATH}"
    assert env["HOME"].startswith(str(settings.data_dir / "runs")) and env["LANG"] == "C.UTF-8"
    if ROOT:  # the team's own uid, which needs no passwd entry: USER names it
        assert env["USER"] == env["LOGNAME"] == "spotbroker-b" and "user=root" not in out


def test_a_node_and_its_metadata_simulator_carry_none_of_the_brokers_settings(broker_env, api, team_headers,
                                                                             settings):
    """They run as the broker's user and inherited its environment: the admin
    token, the database's URL and the signing key sat in two more processes
    per node, for nothing."""
    h = team_headers("b")
    job_id = api.post("/v1/jobs", json={"name": "sleeper", "run": "sleep 30"}, headers=h).json()["id"]
    wait_state(api, h, job_id, {"RUNNING"}, timeout=60)

    def ours() -> dict[str, bytes]:
        found = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if b"spotbroker.broker.launch.local_node" in argv and str(settings.data_dir).encode() in argv[-2]:
                    found[pid] = Path(f"/proc/{pid}/environ").read_bytes()
                    found.update({child: Path(f"/proc/{child}/environ").read_bytes() for child in _children(pid)
                                  if b"spotbroker.agent.metadata_sim" in Path(f"/proc/{child}/cmdline").read_bytes()})
            except OSError:  # gone meanwhile
                continue
        return found

    seen = wait_for(lambda: (lambda f: f if len(f) >= 2 else None)(ours()), timeout=30)  # the node, its simulator
    for pid, environ in seen.items():
        names = {line.split(b"=", 1)[0].decode() for line in environ.split(b"\0") if b"=" in line}
        # (the simulator takes orders with the node's own token, no broker's)
        assert not {n for n in names if n.startswith("SPOTBROKER_")} - {protocol.ENV_SIM_CONTROL_TOKEN}, (pid, names)
        for name, value in BROKER_SECRETS.items():
            if name.startswith("SPOTBROKER_"):
                assert value.encode() not in environ, (pid, name)
    api.post(f"/v1/jobs/{job_id}/cancel", headers=h)


def _children(pid: str) -> list[str]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        out += Path(f"/proc/{pid}/task/{task}/children").read_text().split()
    return out


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
    script = probes_script(probes)
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
    script = probes_script(probes)
    _, out = run_job(api, b, script)
    api.post(f"/v1/jobs/{job_id}/cancel", headers=a)
    for name in probes:
        assert f"{name}=DENIED" in out, out


def probes_script(probes: dict[str, str]) -> str:
    """A shell script that says of each probe whether it worked (DONE) or was refused (DENIED)."""
    return "; ".join(f"if {cmd} >/dev/null 2>&1; then echo {name}=DONE; else echo {name}=DENIED; fi"
                     for name, cmd in probes.items())


def a_running_victim(api, a, settings) -> tuple[dict, Path, dict[str, int]]:
    """Team a's running job: a secret in its environment, a private file in
    its working directory, a checkpoint file in its prefix. Returns the job,
    its node directory and the pids of its trainer and agent."""
    run = ('echo A-PRIVATE-LINE > private.txt; p="${CHECKPOINT_URI#file://}"; echo A-CKPT > "$p/data"; '
           'echo "$$ $PPID" > pids.tmp && mv pids.tmp pids; sleep 120')
    job_id = api.post("/v1/jobs", json={"name": "victim", "run": run, "secrets": {"A_SECRET": "a-secret-7f3e"}},
                      headers=a).json()["id"]
    job = wait_state(api, a, job_id, {"RUNNING"}, timeout=60)
    node = settings.data_dir / "runs" / str(job["attempts"][0]["id"]) / "node-0"
    wait_for(lambda: (node / "workdir" / "pids").exists(), timeout=30, what="the victim's pids")
    trainer, agent = map(int, (node / "workdir" / "pids").read_text().split())
    return job, node, {"trainer": trainer, "agent": agent}


@pytest.mark.skipif(not ROOT, reason="needs root: only root can run each team's jobs as a uid of its own")
def test_another_teams_job_cannot_read_write_or_signal_a_teams_job(broker_env, api, team_headers, settings):
    """Each team's jobs run as a uid of the team's own: from team b's job,
    team a's running job is out of reach through /proc, its node directory,
    its checkpoint prefix and signals."""
    a, b = team_headers("a"), team_headers("b")
    victim, node, pids = a_running_victim(api, a, settings)
    job_prefix = settings.data_dir / "checkpoints" / "a" / str(victim["id"])
    attempt_prefix = job_prefix / str(victim["attempts"][0]["id"])
    q = shlex.quote
    probes = {
        "trainer_environ": f"cat /proc/{pids['trainer']}/environ",
        "agent_environ": f"cat /proc/{pids['agent']}/environ",
        "workdir_file": f"cat {q(str(node / 'workdir' / 'private.txt'))}",
        "workdir_list": f"ls {q(str(node / 'workdir'))}",
        "node_home": f"ls {q(str(node / 'home'))}",
        "checkpoint_read": f"cat {q(str(attempt_prefix / 'data'))}",
        "checkpoint_list": f"ls {q(str(job_prefix))}",
        "checkpoint_plant": f"mkdir {q(str(job_prefix / '99999'))}",
        "checkpoint_overwrite": f"echo planted > {q(str(attempt_prefix / 'data'))}",
        "signal_trainer": f"kill -CONT {pids['trainer']}",
        "signal_agent": f"kill -CONT {pids['agent']}",
    }
    job, out = run_job(api, b, probes_script(probes) + "; echo uid-of-b=$(id -u)")
    assert job["state"] == "SUCCEEDED", out
    for name in probes:
        assert f"{name}=DENIED" in out, out
    assert "a-secret-7f3e" not in out and "A-PRIVATE-LINE" not in out and "A-CKPT" not in out
    # Two uids of the range, each its team's: a's files and processes are a's.
    b_uid = int(out.split("uid-of-b=", 1)[1].split()[0])
    a_uid = os.stat(node / "workdir" / "private.txt").st_uid
    assert a_uid != b_uid and {a_uid, b_uid} <= set(settings.local_uids)
    assert os.stat(f"/proc/{pids['trainer']}").st_uid == a_uid
    assert (attempt_prefix / "data").read_text() == "A-CKPT\n" and not (job_prefix / "99999").exists()
    assert api.get(f"/v1/jobs/{victim['id']}", headers=a).json()["state"] == "RUNNING"
    api.post(f"/v1/jobs/{victim['id']}/cancel", headers=a)


def test_a_jobs_trainer_cannot_read_its_own_agents_token(broker_env, api, team_headers, settings):
    """The agent shares the trainer's uid (it starts it), but not its token:
    the token reaches the agent through a pipe, and the agent keeps its
    /proc files (environ, mem) from the processes of its uid."""
    h = team_headers("a")
    probes = {"agent_environ": "cat /proc/$PPID/environ", "agent_maps": "cat /proc/$PPID/maps",
              "agent_mem": "( exec 3</proc/$PPID/mem )"}
    run = (probes_script(probes) + '; echo "fd=[${SPOTBROKER_AGENT_TOKEN_FD-}]"; '
           'echo "agent=$(tr "\\0" " " < /proc/$PPID/cmdline | cut -c1-100)"')
    job, out = run_job(api, h, run)
    assert job["state"] == "SUCCEEDED", out  # its agent shipped this output: it had its token
    for name in probes:
        assert f"{name}=DENIED" in out, out
    token = agent_token(settings.signing_key(), job["attempts"][0]["id"])
    assert "fd=[]" in out and token not in out and "agent=" in out and "spotbroker.agent.cli run" in out
    events = api.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["events"]
    assert "trainer_started" in [e["type"] for e in events]


def test_the_jobs_code_is_the_trainers_never_imported_by_its_agent(broker_env, api, team_headers, settings,
                                                                   tmp_path):
    """The agent starts in the job's working directory with the job's `envs`,
    yet imports nothing of the job's: a module of the user's named like one
    the agent uses (`random.py`) once failed the job before it started, and
    one that `PYTHONPATH` names ran inside the agent and read its token."""
    from spotbroker.broker.jobs.workdir import pack

    code = tmp_path / "code"
    code.mkdir()
    (code / "random.py").write_text("raise SystemExit('the job\\'s random.py ran in the agent')\n")
    (code / "sitecustomize.py").write_text(
        "import os\nfd = os.environ.get('SPOTBROKER_AGENT_TOKEN_FD')\nif fd:\n"
        "    open(os.path.join(os.environ['HOME'], 'stolen'), 'wb').write(os.read(int(fd), 4096))\n")
    h = team_headers("a")
    with (tmp_path / "code.tgz").open("w+b") as archive:
        sha = pack(code, archive).sha256
        archive.seek(0)
        r = api.put(f"/v1/uploads/{sha}", content=archive.read(), headers={**h, "Content-Type": "application/gzip"})
    assert r.status_code == 201, r.text
    job, out = run_job(api, h, 'cat "$HOME/stolen" 2>/dev/null; echo; echo trainer-ran',
                       workdir={"upload": sha}, envs={"PYTHONPATH": "."})
    assert job["state"] == "SUCCEEDED" and "trainer-ran" in out, out
    assert agent_token(settings.signing_key(), job["attempts"][0]["id"]) not in out


@pytest.mark.skipif(not ROOT, reason="needs root: to read the agent's environment, which it keeps from its uid")
def test_the_loaders_variables_reach_the_trainer_never_its_agent(broker_env, api, team_headers, settings):
    """LD_PRELOAD in a job's `envs` once loaded the job's library into its
    agent as well, where it could read the agent's token."""
    h = team_headers("a")
    loader = {"LD_PRELOAD": "libm.so.6", "LD_LIBRARY_PATH": "/opt/job-libs"}
    run = 'echo "$$ $PPID" > pids.tmp && mv pids.tmp pids; sleep 60'
    job_id = api.post("/v1/jobs", json={"name": "loader", "run": run, "envs": loader}, headers=h).json()["id"]
    job = wait_state(api, h, job_id, {"RUNNING"}, timeout=60)
    node = settings.data_dir / "runs" / str(job["attempts"][0]["id"]) / "node-0"
    wait_for(lambda: (node / "workdir" / "pids").exists(), timeout=30, what="the job's pids")
    trainer, agent = (Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                      for pid in (node / "workdir" / "pids").read_text().split())
    api.post(f"/v1/jobs/{job_id}/cancel", headers=h)
    for name, value in loader.items():
        assert f"{name}={value}".encode() in trainer
        assert not [v for v in agent if v.startswith(f"{name}=".encode())], agent


LISTENER = """
import socket
s = socket.create_server(("127.0.0.1", {port}))
s.settimeout(8)
try:
    print("proxy saw:", s.accept()[0].recv(65536).decode(errors="replace"))
except socket.timeout:
    print("proxy saw nothing")
"""


def test_a_jobs_proxy_settings_never_carry_its_agents_reports(broker_env, api, team_headers, settings):
    """The agent starts with the job's `envs`: its reports, and its token,
    once went through the HTTP_PROXY the job named, which the job itself served."""

    port = free_port()
    h = team_headers("a")
    proxy = f"http://127.0.0.1:{port}"
    job, out = run_job(api, h, f"python -c {shlex.quote(LISTENER.format(port=port))}",
                       envs={"HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "ALL_PROXY": proxy})
    assert job["state"] == "SUCCEEDED" and "proxy saw nothing" in out, out
    assert agent_token(settings.signing_key(), job["attempts"][0]["id"]) not in out


def test_a_job_that_prints_without_end_keeps_a_bounded_log(api, team_headers, settings):
    """Past SPOTBROKER_MAX_LOG_BYTES a log ends with a marker, the job's
    events say so once, and nothing more of the output is stored anywhere
    (the broker's log, the node's raw output, the agent's trainer.log); the
    job itself runs on, and its log can still be read and followed."""
    limit = LOG_BOUND
    h = team_headers("a")
    run = ("python -c \"import sys\nfor i in range(40000): sys.stdout.write(f'{i:09d} ' + 'x' * 90 + chr(10))\"; "
           "echo exit-seen > done")
    job, out = run_job(api, h, run)
    assert job["state"] == "SUCCEEDED", out[-300:]
    marker = f"[spotbroker: output truncated here: a log keeps at most {limit} bytes"
    assert marker in out and len(out.encode()) <= limit + 200 and out.startswith("000000000 ")
    assert out.rstrip().endswith("the rest was not stored]")
    followed = api.get(f"/v1/jobs/{job['id']}/logs", params={"follow": "true"}, headers=h)
    assert followed.status_code == 200 and followed.text.endswith(out + f"\u2014 job {job['id']} SUCCEEDED \u2014\n")
    events = [e for e in api.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["events"]
              if e["type"] == "log_truncated"]
    assert len(events) == 1 and events[0]["data"]["bytes"] == limit
    run_dir = settings.data_dir / "runs" / str(job["attempts"][0]["id"])
    for path in (run_dir / "node-0.out", run_dir / "node-0" / "agent" / "trainer.log"):
        assert path.stat().st_size <= limit + 4096, path  # the agent's own lines and the marker
    assert (run_dir / "node-0" / "workdir" / "done").exists()  # the job ran to its end



def test_a_job_that_prints_its_bound_and_fails_again_and_again_keeps_its_logs_bounded(api, team_headers, settings):
    """Each attempt starts fresh logs: a job that reaches the bound and fails,
    restarting, kept them all. Now its ended attempts keep at most
    SPOTBROKER_MAX_JOB_LOG_BYTES together: each new attempt removes the
    oldest ones' logs (a `log_removed` event each); the newest stay whole."""
    settings.max_job_log_bytes = budget = int(2.5 * LOG_BOUND)
    h = team_headers("a")
    run = "python -c \"import sys\nfor i in range(2000): sys.stdout.write('z' * 99 + chr(10))\"; exit 3"
    job, _ = run_job(api, h, run, max_restarts=5)
    ids = [a["id"] for a in job["attempts"]]
    assert job["state"] == "FAILED" and len(ids) == 6
    reads = [api.get(f"/v1/jobs/{job['id']}/logs", params={"attempt": i}, headers=h) for i in ids]
    assert [r.status_code for r in reads] == [410] * 3 + [200] * 3
    assert f"attempt {ids[0]}'s log (" in reads[0].json()["detail"] and "SPOTBROKER_MAX_JOB_LOG_BYTES" in \
        reads[0].json()["detail"]
    sizes = [len(r.content) for r in reads[3:]]
    assert all(LOG_BOUND < n < LOG_BOUND + 200 for n in sizes), sizes
    assert sum(sizes[:-1]) <= budget  # what the last new attempt found ended, and kept
    removed = [e for e in api.get(f"/v1/jobs/{job['id']}/events", headers=h).json()["events"]
               if e["type"] == "log_removed"]
    assert [(e["attempt_id"], e["data"]["setting"]) for e in removed] == [
        (i, "SPOTBROKER_MAX_JOB_LOG_BYTES") for i in ids[:3]]
    assert all(LOG_BOUND < e["data"]["bytes"] < LOG_BOUND + 200 for e in removed)

@pytest.mark.skipif(not ROOT, reason="needs root: a job of the broker's own user changes nothing root would not")
def test_a_link_a_job_leaves_in_its_prefix_does_not_lead_the_next_attempts_provisioning(
        broker_env, api, team_headers, settings, tmp_path):
    """The job owns its job prefix, so an attempt can leave a link where the
    next attempt's prefix will be made: the node (root) must not change the
    mode or owner of what it points to."""
    settings.launch_retries = 0  # a failed start is retried; the link is for the attempt after this one only
    target = tmp_path / "the-brokers"
    target.mkdir()
    target.chmod(0o755)
    h = team_headers("a")
    run = ('p="${SPOTBROKER_CHECKPOINT_JOB_URI#file://}"; '
           'if [ ! -e "$p/once" ]; then touch "$p/once"; '
           f'ln -s {shlex.quote(str(target))} "$p/$((SPOTBROKER_ATTEMPT_ID + 1))"; exit 1; fi; echo second')
    job_id = api.post("/v1/jobs", json={"name": "link", "run": run, "max_restarts": 1}, headers=h).json()["id"]
    job = wait_state(api, h, job_id, {"SUCCEEDED", "FAILED"}, timeout=60)
    assert len(job["attempts"]) == 2
    info = target.stat()
    assert (info.st_mode & 0o777, info.st_uid) == (0o755, 0), job
    assert "is a link or not a directory" in job["reason"], job


@pytest.mark.skipif(not ROOT, reason="needs root: files change hands only as root")
def test_a_job_prefix_another_uid_wrote_becomes_the_teams_but_not_what_root_wrote(
        broker_env, api, team_headers, settings, tmp_path):
    """Checkpoints written before each team had its own uid (as one shared
    user): the job's next attempt can resume from them, what the broker
    wrote (a KEEP marker) stays root's, and a file with another link keeps
    its owner."""
    old_uid = 4242
    a = team_headers("a")
    step = settings.data_dir / "checkpoints" / "a" / "1" / "7" / "step-000000000001"
    step.mkdir(parents=True)
    (step / "data").write_text("OLD-CKPT\n")
    (step / "KEEP").touch()
    (tmp_path / "elsewhere").write_text("another's\n")
    os.link(tmp_path / "elsewhere", step / "linked")
    for path in (step.parent.parent, step.parent, step, step / "data", step / "linked"):
        os.chown(path, old_uid, old_uid)
        path.chmod(0o700 if path.is_dir() else 0o600)
    job, out = run_job(api, a, 'cat "${SPOTBROKER_CHECKPOINT_JOB_URI#file://}/7/step-000000000001/data"')
    assert job["id"] == 1 and job["state"] == "SUCCEEDED" and "OLD-CKPT" in out, out
    team_uid = os.stat(step / "data").st_uid
    assert team_uid in settings.local_uids and os.stat(step).st_uid == team_uid
    assert os.stat(step / "KEEP").st_uid == 0 and os.stat(step / "linked").st_uid == old_uid
