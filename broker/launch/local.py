"""The local launcher: runs an attempt on this host, one node process per node.

It stands in for a cloud while running here: the attempt carries the chosen
offer (cloud, zone, price), each node is a `local_node` process (the VM),
and the job gets the variables SkyPilot sets on real nodes. Everything it
needs to find a run again lives in the run's directory, so any broker
process on this host, including one started after a crash, can observe or
stop runs that another one launched.

    {data_dir}/runs/{attempt_id}/node-{rank}.json   pid and start time (the launcher's record)
    {data_dir}/runs/{attempt_id}/node-{rank}.self   the same, written by the node itself first
    {data_dir}/runs/{attempt_id}/node-{rank}.claim  who may start it (local_claims.py)
    {data_dir}/runs/{attempt_id}/node-{rank}.spec.json  what the node is to do, secrets included:
                                                    0600, removed by the node once read
    {data_dir}/runs/{attempt_id}/exit-{rank}        the job's exit code, written last
    {data_dir}/runs/{attempt_id}/error-{rank}       why the node could not start the job
    {data_dir}/runs/{attempt_id}/stopping           the run was stopped for a failed node (once)
    {data_dir}/runs/{attempt_id}/sim.url            node 0's metadata simulator (sim-{rank}.url: others')
    {data_dir}/runs/{attempt_id}/node-{rank}/       the node's own: home/, tmp/, workdir/, agent/
    {data_dir}/runs/{attempt_id}/node-{rank}.out    the node's raw output (its agent ships the
                                                    trainer's to the broker's log store)

Every node runs its own agent and, when the attempt simulates a cloud, its
own metadata simulator, as every VM of a real cluster has its own. A run's
directory is removed a while after the attempt ended (local_runs.py).

A job sees nothing of the broker's: its environment is built from an
allow-list (`job_env`), never inherited, and when the broker runs as root
each team's jobs run as a uid of the team's own (`identity.py`), which
cannot read the broker's database, secret key or logs, nor another team's
processes, node directories or file:// checkpoint prefixes. The node agent
gets its token through a pipe, not the environment, and keeps its memory
from the trainer, which shares its uid. A job's output is kept up to
SPOTBROKER_MAX_LOG_BYTES per log. With a cloud checkpoint root (s3://,
gs://) each job gets the same per-attempt credentials, scoped to its job,
as a cloud node does.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from urllib.parse import unquote, urlparse

from spotbroker.agent import protocol
from spotbroker.agent.proctree import kill_tree, start_time
from spotbroker.broker.jobs.runs import RunState, RunStatus
from spotbroker.broker.launch.base import Handle, LaunchError, LaunchRequest
from spotbroker.broker.launch.identity import SYSTEM_PATH, JobUsers, secure_data_dir
from spotbroker.broker.launch.local_claims import claim_node
from spotbroker.broker.launch.local_node import (
    SIMULATOR_START_S,
    NodeSpec,
    sim_token_file,
    sim_url_file,
    start_failure,
)
from spotbroker.broker.launch.local_rendezvous import rendezvous_env
from spotbroker.broker.pricing import gcp_n1
from spotbroker.broker.pricing.offers import Placement

log = logging.getLogger(__name__)

SIMULATED_CLOUDS = ("aws", "gcp", "azure")


def node_env() -> dict[str, str]:
    """A node's environment (and its metadata simulator's): the broker's, but
    its own settings (`SPOTBROKER_*`: the admin token, the database's URL,
    the signing key), which a node has no use for. The job's is built apart
    (`job_env`), never inherited."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}


def job_python_default() -> str:
    """The jobs' interpreter unless told: the one `make install` recorded in
    this environment (see scripts/ensure-job-user), else the broker's own."""
    recorded = Path(sys.prefix) / "spotbroker-job-python"
    if recorded.exists():
        return recorded.read_text().strip()
    return sys.executable


class LocalLauncher:
    name = "local"

    def __init__(self, data_dir: Path, kill_grace_seconds: float = 10.0, notice_window: float | None = None,
                 python: str = sys.executable, agent: bool = True, run_as: str | None = None,
                 users: JobUsers | None = None, max_log_bytes: int = 0) -> None:
        self.data_dir = data_dir
        self.agent = agent  # off only where a run's own agent would get in the way (benchmarks)
        self.kill_grace_seconds = kill_grace_seconds
        self.notice_window = notice_window
        self.python = python  # the jobs' interpreter: first on their PATH, runs their agent
        self.users = users or JobUsers(shared=run_as)  # who each team's jobs run as
        self.max_log_bytes = max_log_bytes  # per log: node 0's trainer log, each node's output (0: no bound)
        self._ready = False
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings) -> LocalLauncher:
        launcher = cls(settings.data_dir, settings.local_kill_grace_seconds, notice_window=settings.local_notice_window,
                       python=settings.local_job_python or job_python_default(), users=JobUsers.from_settings(settings),
                       max_log_bytes=settings.max_log_bytes)
        if launcher.users.separate:
            secure_data_dir(settings.data_dir)
        return launcher

    def run_dir(self, attempt_id: int) -> Path:
        return self.data_dir / "runs" / str(attempt_id)

    # --- launching -------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> Handle:
        self._check_ready()
        self.users.for_team(request.team_id, request.team)  # a team without a user fails before anything starts
        run_dir = self.run_dir(request.attempt_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        run_dir.chmod(0o711)  # the job's user reaches its node dir, and nothing else here
        nodes = []
        for rank in range(request.num_nodes):
            node_file = run_dir / f"node-{rank}.json"
            if node_file.exists():  # launched before a restart: do not start it twice
                nodes.append(json.loads(node_file.read_text()))
                continue
            out = self._output(request, rank)
            found = claim_node(run_dir, rank)
            if found is None:  # ours to start
                found = self._start_node(request, rank, out)
            found["log"] = str(out)  # else a launcher died between starting this node and recording it
            _write_json(node_file, found)
            nodes.append(found)
        return {"run_dir": str(run_dir), "nodes": nodes}

    def _with_agent(self, request: LaunchRequest, rank: int) -> bool:
        """Every node runs an agent (each catches its own node's notice)."""
        return self.agent and protocol.ENV_AGENT_TOKEN in request.extra_env

    def _output(self, request: LaunchRequest, rank: int) -> Path:
        # The raw stream stays in the run directory, as a VM's console stays on
        # the VM: each node's agent ships its trainer's output to the broker's
        # log store (any replica's), as it does on a cloud.
        return self.run_dir(request.attempt_id) / f"node-{rank}.out"

    def _start_node(self, request: LaunchRequest, rank: int, out: Path) -> dict:
        run_dir = self.run_dir(request.attempt_id)
        node_dir = run_dir / f"node-{rank}"
        with_agent = self._with_agent(request, rank)
        # (setup's failure said in the output: one script, the exit code alone did not tell which failed)
        setup = (f"( {request.setup}\n) || {{ status=$?; echo \"spotbroker: setup failed (exit code $status): run "
                 "did not start\" >&2; exit $status; }")
        script = "\n".join(([setup] if request.setup else []) + [request.run])
        command = ["bash", "-c", script]
        if with_agent:
            # Isolated (-I): the agent starts in the job's workdir with its
            # `envs`, but imports nothing from there nor from PYTHONPATH, which
            # are the trainer's (a job's `random.py` once ran inside the agent).
            command = [self.python, "-I", "-m", "spotbroker.agent.cli", "run", "--work-dir", str(node_dir / "agent"),
                       "--max-log-bytes", str(self.max_log_bytes), "--", *command]
        simulated = with_agent and request.placement.cloud in SIMULATED_CLOUDS
        user = self.users.for_team(request.team_id, request.team)
        spec = NodeSpec(
            rank=rank, run_dir=str(run_dir), node_dir=str(node_dir), command=command,
            env=self.job_env(request, rank, node_dir, with_agent),
            owner=[user.uid, user.gid] if user else None,
            agent_token=request.extra_env.get(protocol.ENV_AGENT_TOKEN) if with_agent else None,
            code=asdict(request.code) if request.code else None,
            checkpoint_dirs=_local_prefixes(request.extra_env) + _local_buckets(request.mounts or ()),
            mounts=[m.document() for m in request.mounts or ()], kill_grace=self.kill_grace_seconds,
            max_log_bytes=self.max_log_bytes,
            simulator=self._simulator_args(request.placement.cloud) if simulated else None)
        spec_file = run_dir / f"node-{rank}.spec.json"
        fd = os.open(spec_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the agent's token
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(spec), f)
        out.parent.mkdir(parents=True, exist_ok=True)
        # The raw output is the broker's: a job of another team that guesses the path must not read it.
        with os.fdopen(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as sink, _sigterm_held():
            proc = subprocess.Popen([sys.executable, "-m", "spotbroker.broker.launch.local_node", str(spec_file)],
                                    stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=str(run_dir), env=node_env())
        with self._lock:
            self._children[proc.pid] = proc
        node = {"rank": rank, "pid": proc.pid, "start": start_time(proc.pid), "marks_start": True,
                "simulated": simulated}
        # Another broker on the database may see the run end and release it, and this one then never
        # asks after it again: its exit is collected here (else a zombie until this broker restarts).
        threading.Thread(target=self._collect, args=(proc,), name=f"node-{proc.pid}", daemon=True).start()
        return node

    def _collect(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        with self._lock:
            self._children.pop(proc.pid, None)

    def job_env(self, request: LaunchRequest, rank: int, node_dir: Path, with_agent: bool) -> dict[str, str]:
        """A job's whole environment, built here and never inherited: a defined
        PATH whose `python` is the jobs' interpreter (the environment spotbroker
        runs in, which has the checkpoint library), its own HOME and TMPDIR, the
        job's `envs` and `secrets`, the variables SkyPilot sets on a node, and the attempt's own
        (ids, checkpoint prefixes, the broker's address; storage credentials
        scoped to the job when the checkpoint root is a cloud's). Never the
        agent's token: the node hands it to the agent through a pipe."""
        p = request.placement
        job_user = self.users.for_team(request.team_id, request.team)
        user = job_user.name if job_user else pwd.getpwuid(os.getuid()).pw_name
        env = {
            "PATH": f"{Path(self.python).parent}:{SYSTEM_PATH}", "HOME": str(node_dir / "home"),
            "TMPDIR": str(node_dir / "tmp"), "LANG": "C.UTF-8", "SHELL": "/bin/bash", "USER": user,
            "LOGNAME": user, **rendezvous_env(self.run_dir(request.attempt_id), request.num_nodes),
            **request.envs, **request.secrets,
            "SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NUM_NODES": str(request.num_nodes),
            "SKYPILOT_NODE_IPS": "\n".join(["127.0.0.1"] * request.num_nodes),
            "SKYPILOT_NUM_GPUS_PER_NODE": f"{p.accelerator_count:g}",
            # the job's, the same across its attempts (as a managed job's is in SkyPilot): recipes
            # use it as torchrun's --rdzv_id and to name files in a shared /tmp
            "SKYPILOT_TASK_ID": f"spotbroker-job-{request.job_id}",
            "SKYPILOT_CLUSTER_INFO": json.dumps({
                "cluster_name": f"spotbroker-{request.attempt_id}", "cloud": p.cloud, "region": p.region,
                "zone": p.zone or p.zone_id, "num_nodes": request.num_nodes}),
            protocol.ENV_CLOUD: p.cloud, protocol.ENV_REGION: p.region or "",
            protocol.ENV_ZONE: p.zone or p.zone_id or "",
            protocol.ENV_INSTANCE_TYPE: gcp_n1.machine_type(p.instance_type or ""),
            **request.extra_env,
            **request.storage_env,  # the node's own credentials, scoped to the job (none for a file:// root)
        }
        if request.mounts:  # no file system of its own to give a job: absolute mount paths are under this
            env[protocol.ENV_MOUNT_ROOT] = str(node_dir / "fs")
        env.pop(protocol.ENV_AGENT_TOKEN, None)  # in no process's environment, which its uid could read
        if with_agent and p.cloud in SIMULATED_CLOUDS and self.notice_window is not None:
            env[protocol.ENV_NOTICE_WINDOW] = f"{self.notice_window:g}"  # GCP publishes no deadline
        return env

    def _simulator_args(self, cloud: str) -> list[str]:
        args = ["--cloud", cloud, "--port", "0"]
        if self.notice_window is not None:
            args += ["--window", f"{self.notice_window:g}"]
        return args

    def _check_ready(self) -> None:
        """Once per launcher: can the jobs' users run the jobs' interpreter and
        reach the run directories? Else every launch fails saying what to fix."""
        if not self._ready:
            self.users.check(self.python, self.data_dir / "runs")
            self._ready = True

    # --- the simulated cloud ---------------------------------------------------------

    def probe(self, placement: Placement) -> bool:
        """This host runs whatever is asked of it: spot capacity is always there
        (the cap on concurrent runs is the reconciler's, not capacity)."""
        return True

    def simulate_preemption(self, handle: Handle, node: int = 0) -> dict:
        """Make the metadata simulator of the attempt's node `node` publish a preemption notice."""
        url = self.simulator_url(handle, node)
        if not url:
            raise LaunchError("this attempt has no metadata simulator (a job on the broker's host, or not started yet)")
        token_file = Path(handle["run_dir"]) / sim_token_file(node)
        headers = {"X-Sim-Token": token_file.read_text().strip()} if token_file.exists() else {}
        body = {} if self.notice_window is None else {"notice_seconds": self.notice_window}
        import httpx  # here: a broker that never simulates a notice starts without it (and rich, pygments)

        try:
            r = httpx.post(f"{url}/_sim/preempt", json=body, headers=headers, timeout=5)
            r.raise_for_status()
        except httpx.HTTPError as exc:
            raise LaunchError(f"the metadata simulator did not take the notice: {exc}") from None
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else {}

    def simulator_url(self, handle: Handle, rank: int = 0) -> str:
        """Where node `rank`'s simulator listens. The node starts it after the
        launch has returned: a notice asked for at once waits for it, as long as
        the node itself does, while the node lives ("" when it has none)."""
        url_file = Path(handle["run_dir"]) / sim_url_file(rank)
        node = next((n for n in handle["nodes"] if n["rank"] == rank), None)
        deadline = time.monotonic() + SIMULATOR_START_S
        while True:
            text = url_file.read_text() if url_file.exists() else ""
            if "\n" in text:  # the whole line: the simulator listens
                return text.split("\n", 1)[0].strip()
            if (node is None or not node.get("simulated") or time.monotonic() > deadline
                    or start_time(node["pid"]) != node["start"]):
                return ""
            time.sleep(0.05)

    # --- observing and stopping ------------------------------------------------------

    def _reap(self, pids: list[int]) -> None:
        """Collect the exit of our own children among `pids`, so they do not
        linger as zombies (runs started by an earlier broker are not ours)."""
        with self._lock:
            for pid in pids:
                proc = self._children.get(pid)
                if proc is not None and proc.poll() is not None:
                    del self._children[pid]

    def _node_state(self, run_dir: Path, node: dict) -> tuple[RunState, int | None]:
        exit_file = run_dir / f"exit-{node['rank']}"
        if exit_file.exists():
            code = int(exit_file.read_text().strip() or 1)
            return (RunState.SUCCEEDED if code == 0 else RunState.FAILED), code
        started = node.get("start")
        if started is not None and start_time(node["pid"]) == started:
            return RunState.RUNNING, None
        if exit_file.exists():  # it finished between the two looks
            return self._node_state(run_dir, node)
        return RunState.GONE, None

    def status(self, handle: Handle) -> RunStatus:
        self._reap([n["pid"] for n in handle["nodes"]])
        run_dir = Path(handle["run_dir"])
        for node in handle["nodes"]:
            error = run_dir / f"error-{node['rank']}"
            if error.exists():
                return RunStatus(RunState.FAILED, error=json.loads(error.read_text())["reason"])
        states = [self._node_state(run_dir, n) for n in handle["nodes"]]
        for node, (state, _) in zip(handle["nodes"], states, strict=True):
            if state == RunState.GONE and (why := start_failure(run_dir, node)):
                return RunStatus(RunState.FAILED, error=why)  # a failed start, not a reclaim
        if any(s == RunState.GONE for s, _ in states):
            return RunStatus(RunState.GONE)
        failed = [(node["rank"], code) for node, (s, code) in zip(handle["nodes"], states, strict=True)
                  if s == RunState.FAILED]
        if any(s == RunState.RUNNING for s, _ in states):
            if failed:
                # One node failing fails the run, and the others are stopped, as
                # SkyPilot's driver does: they may wait for it forever (torchrun).
                self._stop_once(handle)
            # The run is judged once every node has ended: a peer's failure is
            # often the echo of a node being lost, whose agent is still
            # delivering its notice (it does so before its node ends).
            return RunStatus(RunState.RUNNING)
        if failed:  # the first to fail says why: the others' codes may be our stop's
            first = min(failed, key=lambda f: ((run_dir / f"exit-{f[0]}").stat().st_mtime_ns, f[0]))
            return RunStatus(RunState.FAILED, first[1])
        return RunStatus(RunState.SUCCEEDED, 0)

    def _stop_once(self, handle: Handle) -> None:
        """`terminate`, the first time only: the node's grace period starts
        again with every SIGTERM, and a pass comes every few seconds."""
        try:
            os.close(os.open(Path(handle["run_dir"]) / "stopping", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            return
        self.terminate(handle)

    def terminate(self, handle: Handle) -> None:
        """SIGTERM each node (it passes it to every process of its job), then
        kill whatever is left of it after the grace period."""
        live = [n for n in handle.get("nodes", []) if n.get("start") and start_time(n["pid"]) == n["start"]]
        for node in live:
            try:
                os.kill(node["pid"], signal.SIGTERM)
            except ProcessLookupError:
                pass
        if live:
            threading.Thread(target=self._kill_later, args=(live,), daemon=True).start()

    def _kill_later(self, nodes: list[dict]) -> None:
        # The node itself kills its job after the grace period; this is for a node that is stuck.
        deadline = time.monotonic() + self.kill_grace_seconds + 5
        pids = [n["pid"] for n in nodes]
        while time.monotonic() < deadline:
            self._reap(pids)
            if not any(start_time(n["pid"]) == n["start"] for n in nodes):
                return
            time.sleep(0.1)
        for node in nodes:
            if start_time(node["pid"]) == node["start"]:
                kill_tree(node["pid"])
        self._reap(pids)


@contextlib.contextmanager
def _sigterm_held() -> Iterator[None]:
    """SIGTERM blocked in this thread while it starts a node, which inherits
    the mask: a stop that comes while the node's interpreter starts waits
    until the node can take it (`local_node` unblocks it once its handler is
    in), so that the node ends with a code instead of vanishing."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _local_prefixes(extra_env: dict[str, str]) -> list[str]:
    """The job's file:// checkpoint prefixes (the job's, then the attempt's),
    which the node makes and gives to the job's user."""
    out = []
    for name in (protocol.ENV_CHECKPOINT_ROOT, protocol.ENV_CHECKPOINT_URI):
        uri = urlparse(extra_env.get(name, ""))
        if uri.scheme == "file":
            out.append(unquote(uri.path))
    return out


def _local_buckets(mounts) -> list[str]:
    """The file:// buckets the job may write (its team's, by name): made and
    given to the job's user like its checkpoint prefixes."""
    return [unquote(urlparse(m.uri).path).rstrip("/") for m in mounts
            if m.kind == "bucket" and not m.read_only and m.uri.startswith("file://")]


def _write_json(path: Path, value: dict) -> None:
    """A run record (a node's pid and start time, its output's path): the broker's alone."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a leftover from an older broker keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(value))
    tmp.replace(path)

