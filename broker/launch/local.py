"""The local launcher: runs an attempt as local process groups, one per node.

It stands in for a cloud while running here: the attempt carries the chosen
offer (cloud, zone, price) and the processes get the same variables SkyPilot
sets on real nodes. Everything it needs to find a run again lives in the
run's directory, so any broker process on this host, including one started
after a crash, can observe or stop runs that another one launched.

    {data_dir}/runs/{attempt_id}/node-{rank}.json   pid and start time
    {data_dir}/runs/{attempt_id}/exit-{rank}        exit code, written last
    {data_dir}/logs/{job_id}/{attempt_id}.log       node 0's output (node-{rank} for others)
"""
from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from spotbroker.agent import protocol
from spotbroker.broker.launch.base import Handle, LaunchError, LaunchRequest, RunState, RunStatus
from spotbroker.broker.logs import log_path
from spotbroker.broker.offers import Placement

log = logging.getLogger(__name__)

# The wrapper records the exit code atomically once the command ends; a node
# that dies without one (killed with its group, host lost) counts as gone.
_RECORD_EXIT = 'rc=$?; echo $rc > "$SPOTBROKER_EXIT.tmp" && mv "$SPOTBROKER_EXIT.tmp" "$SPOTBROKER_EXIT"; exit $rc'
# First act of every node: record its own pid and kernel start time, so that a
# launcher that died between starting it and writing node-{rank}.json can be
# followed by one that finds it instead of starting it twice.
_RECORD_SELF = ('echo "$$ $(cut -d" " -f22 /proc/$$/stat)" > "$SPOTBROKER_SELF.tmp" '
                '&& mv "$SPOTBROKER_SELF.tmp" "$SPOTBROKER_SELF"\n')
_WRAPPER = _RECORD_SELF + 'bash -c "$SPOTBROKER_SCRIPT"; ' + _RECORD_EXIT
# Node 0 runs under the node agent, as on a cloud node. For a simulated cloud
# a metadata-service simulator runs beside it, in the same process group (so
# that the simulated hard stop reclaims the whole node, simulator included),
# and the agent watches it instead of the cloud's own endpoint.
_AGENT_WRAPPER = _RECORD_SELF + """
sim=
if [ -n "$SPOTBROKER_SIM_CLOUD" ]; then
    "$SPOTBROKER_PYTHON" -m spotbroker.agent.simulator --cloud "$SPOTBROKER_SIM_CLOUD" --port 0 \
        $SPOTBROKER_SIM_ARGS --kill-at-hard-stop $$ > sim.url 2> sim.log &
    sim=$!
    for _ in $(seq 1 200); do [ -s sim.url ] && break; sleep 0.05; done
    export SPOTBROKER_METADATA_URL="$(head -n 1 sim.url)"
fi
"$SPOTBROKER_PYTHON" -m spotbroker.agent.cli run --work-dir agent -- bash -c "$SPOTBROKER_SCRIPT"
rc=$?
if [ -n "$sim" ]; then kill "$sim" 2>/dev/null; fi  # the node's simulator ends with its run
(exit $rc)
""" + _RECORD_EXIT
SIMULATED_CLOUDS = ("aws", "gcp", "azure")


def _start_time(pid: int) -> str | None:
    """The kernel's start time of a process: tells a live pid from a reused one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z":  # a zombie has finished
        return None
    return fields[19]


class LocalLauncher:
    name = "local"

    def __init__(self, data_dir: Path, kill_grace_seconds: float = 10.0, notice_window: float | None = None,
                 python: str = sys.executable, agent: bool = True) -> None:
        self.data_dir = data_dir
        self.agent = agent  # off only where a run's own agent would get in the way (benchmarks)
        self.kill_grace_seconds = kill_grace_seconds
        self.notice_window = notice_window
        self.python = python
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    def run_dir(self, attempt_id: int) -> Path:
        return self.data_dir / "runs" / str(attempt_id)

    def launch(self, request: LaunchRequest) -> Handle:
        run_dir = self.run_dir(request.attempt_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        script = "\n".join(
            ([f"cd {shlex.quote(request.workdir)}"] if request.workdir else [])
            + ([f"( {request.setup}\n) || exit $?"] if request.setup else [])
            + [request.run]
        )
        ips = "\n".join(["127.0.0.1"] * request.num_nodes)
        p = request.placement
        nodes = []
        for rank in range(request.num_nodes):
            node_file = run_dir / f"node-{rank}.json"
            if node_file.exists():  # launched before a restart: do not start it twice
                nodes.append(json.loads(node_file.read_text()))
                continue
            found = self._claim_node(run_dir, rank)
            if found is not None:  # a launcher died between starting this node and recording it
                found["log"] = str(run_dir / "node-0.out" if rank == 0 and self.agent and
                                   protocol.ENV_AGENT_TOKEN in request.extra_env
                                   else log_path(self.data_dir, request.job_id, request.attempt_id, rank))
                _write_json(node_file, found)
                nodes.append(found)
                continue
            with_agent = self.agent and rank == 0 and protocol.ENV_AGENT_TOKEN in request.extra_env
            # Under the agent, node 0's output reaches the broker's log through
            # the agent's channel; the raw stream stays in the run directory.
            out = (run_dir / "node-0.out" if with_agent
                   else log_path(self.data_dir, request.job_id, request.attempt_id, rank))
            out.parent.mkdir(parents=True, exist_ok=True)
            env = {
                **os.environ, **request.envs, **request.extra_env,
                "SPOTBROKER_SCRIPT": script, "SPOTBROKER_EXIT": str(run_dir / f"exit-{rank}"),
                "SPOTBROKER_SELF": str(run_dir / f"node-{rank}.self"),
                "SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NUM_NODES": str(request.num_nodes),
                "SKYPILOT_NODE_IPS": ips, "SKYPILOT_NUM_GPUS_PER_NODE": f"{p.accelerator_count:g}",
                "SPOTBROKER_CLOUD": p.cloud, "SPOTBROKER_REGION": p.region or "",
                "SPOTBROKER_ZONE": p.zone or p.zone_id or "",
                "SPOTBROKER_INSTANCE_TYPE": p.instance_type or "",
            }
            if with_agent:
                env.update(self._agent_env(p.cloud))
            else:  # only node 0 holds the agent's channel
                env.pop(protocol.ENV_AGENT_TOKEN, None)
            wrapper = _AGENT_WRAPPER if with_agent else _WRAPPER
            with out.open("ab") as sink:
                proc = subprocess.Popen(["bash", "-c", wrapper], stdin=subprocess.DEVNULL, stdout=sink,
                                        stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                        cwd=str(run_dir))
            node = {"rank": rank, "pid": proc.pid, "start": _start_time(proc.pid), "log": str(out)}
            with self._lock:
                self._children[proc.pid] = proc
            _write_json(node_file, node)
            nodes.append(node)
        return {"run_dir": str(run_dir), "nodes": nodes}

    def _claim_node(self, run_dir: Path, rank: int, wait_s: float = 5.0) -> dict | None:
        """Claim the right to start node `rank` (atomically, O_EXCL). If an
        earlier launcher holds the claim, it may have started the node before
        dying: wait for the node's own record and return it; None means
        "start it now"."""
        try:
            os.close(os.open(run_dir / f"node-{rank}.claim", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
            return None
        except FileExistsError:
            pass
        own = run_dir / f"node-{rank}.self"
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if own.exists():
                pid, start = own.read_text().split()
                return {"rank": rank, "pid": int(pid), "start": start}
            time.sleep(0.05)
        return None  # nothing was started under the earlier claim

    def _agent_env(self, cloud: str) -> dict[str, str]:
        env = {"SPOTBROKER_PYTHON": self.python, "SPOTBROKER_SIM_CLOUD": "", "SPOTBROKER_SIM_ARGS": ""}
        if cloud in SIMULATED_CLOUDS:
            env["SPOTBROKER_SIM_CLOUD"] = cloud
            if self.notice_window is not None:
                env["SPOTBROKER_SIM_ARGS"] = f"--window {self.notice_window:g}"
                env["SPOTBROKER_NOTICE_WINDOW"] = f"{self.notice_window:g}"  # GCP publishes no deadline
        return env

    def probe(self, placement: Placement) -> bool:
        """This host runs whatever is asked of it: spot capacity is always there
        (the cap on concurrent runs is the reconciler's, not capacity)."""
        return True

    def simulate_preemption(self, handle: Handle) -> dict:
        """Make the attempt's metadata simulator publish a preemption notice."""
        url_file = Path(handle["run_dir"]) / "sim.url"
        url = url_file.read_text().split("\n", 1)[0].strip() if url_file.exists() else ""
        if not url:
            raise LaunchError("this attempt has no metadata simulator (a CPU job, or not started yet)")
        body = {} if self.notice_window is None else {"notice_seconds": self.notice_window}
        try:
            r = httpx.post(f"{url}/_sim/preempt", json=body, timeout=5)
            r.raise_for_status()
        except httpx.HTTPError as exc:
            raise LaunchError(f"the metadata simulator did not take the notice: {exc}") from None
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else {}

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
        if started is not None and _start_time(node["pid"]) == started:
            return RunState.RUNNING, None
        if exit_file.exists():  # it finished between the two looks
            return self._node_state(run_dir, node)
        return RunState.GONE, None

    def status(self, handle: Handle) -> RunStatus:
        self._reap([n["pid"] for n in handle["nodes"]])
        run_dir = Path(handle["run_dir"])
        states = [self._node_state(run_dir, n) for n in handle["nodes"]]
        if any(s == RunState.GONE for s, _ in states):
            return RunStatus(RunState.GONE)
        if any(s == RunState.RUNNING for s, _ in states):
            return RunStatus(RunState.RUNNING)
        failed = [code for s, code in states if s == RunState.FAILED]
        if failed:
            return RunStatus(RunState.FAILED, failed[0])
        return RunStatus(RunState.SUCCEEDED, 0)

    def terminate(self, handle: Handle) -> None:
        """SIGTERM each node's process group now, SIGKILL after the grace period."""
        live = [n for n in handle.get("nodes", []) if n.get("start") and _start_time(n["pid"]) == n["start"]]
        for node in live:
            _signal_group(node["pid"], signal.SIGTERM)
        if live:
            threading.Thread(target=self._kill_later, args=(live,), daemon=True).start()

    def _kill_later(self, nodes: list[dict]) -> None:
        deadline = time.monotonic() + self.kill_grace_seconds
        pids = [n["pid"] for n in nodes]
        while time.monotonic() < deadline:
            self._reap(pids)
            if not any(_start_time(n["pid"]) == n["start"] for n in nodes):
                return
            time.sleep(0.1)
        for node in nodes:
            if _start_time(node["pid"]) == node["start"]:
                _signal_group(node["pid"], signal.SIGKILL)
        self._reap(pids)


def _write_json(path: Path, value: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # start_new_session made the pid its group's leader
    except ProcessLookupError:
        pass
    except PermissionError:
        log.warning("not allowed to signal process group %d", pid)
