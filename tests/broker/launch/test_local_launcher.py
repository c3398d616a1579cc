"""The local launcher never starts a node twice, even when a launcher died
between starting it and recording it."""
from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import replace

import pytest
from support.helpers import processes

from spotbroker.agent import protocol
from spotbroker.agent.proctree import start_time
from spotbroker.broker.jobs.runs import RunState
from spotbroker.broker.launch.base import LaunchError, LaunchRequest
from spotbroker.broker.launch.local import LocalLauncher
from spotbroker.broker.pricing.offers import LOCAL_PLACEMENT


def request(tmp_path, run: str) -> LaunchRequest:
    return LaunchRequest(attempt_id=7, job_id=1, team="ml", run=run, setup=None, envs={},
                         num_nodes=1, placement=LOCAL_PLACEMENT)


def test_a_node_started_but_not_recorded_is_found_not_started_again(tmp_path):
    launcher = LocalLauncher(tmp_path, 1)
    marker = tmp_path / "ran.txt"
    req = request(tmp_path, f"echo ran >> {marker}; sleep 1")
    first = launcher.launch(req)
    node = first["nodes"][0]
    # The node's own record agrees with what the kernel says about it.
    deadline = time.monotonic() + 5
    while not (tmp_path / "runs" / "7" / "node-0.self").exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert (tmp_path / "runs" / "7" / "node-0.self").read_text().split() == [str(node["pid"]), start_time(node["pid"])]
    (tmp_path / "runs" / "7" / "node-0.json").unlink()  # the launcher died before recording it
    again = LocalLauncher(tmp_path, 1).launch(req)
    assert (again["nodes"][0]["pid"], again["nodes"][0]["start"]) == (node["pid"], node["start"])
    while launcher.status(again).state == RunState.RUNNING:
        time.sleep(0.05)
    assert launcher.status(again).state == RunState.SUCCEEDED
    assert marker.read_text() == "ran\n"


def test_a_node_whose_interpreter_starts_slowly_is_found_not_started_again(tmp_path):
    """On a loaded host a node's Python can take longer than the launcher
    waits for its record (the killed-brokers test ran a job twice): the
    process that names the node's spec file is that node."""
    import subprocess
    import sys

    run_dir = tmp_path / "runs" / "7"
    run_dir.mkdir(parents=True)
    (run_dir / "node-0.claim").touch()  # an earlier launcher claimed the node, started it, and died
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(run_dir / "node-0.spec.json")])
    try:
        handle = LocalLauncher(tmp_path, 1).launch(request(tmp_path, "echo ran"))
        assert (handle["nodes"][0]["pid"], handle["nodes"][0]["start"]) == (slow.pid, start_time(slow.pid))
        assert not (run_dir / "node-0.out").exists() or b"ran" not in (run_dir / "node-0.out").read_bytes()
    finally:
        slow.kill()
        slow.wait()


def test_a_claim_under_which_nothing_started_does_not_block_the_launch(tmp_path):
    launcher = LocalLauncher(tmp_path, 1)
    run_dir = tmp_path / "runs" / "7"
    run_dir.mkdir(parents=True)
    (run_dir / "node-0.claim").touch()  # a launcher died after claiming, before starting
    handle = launcher.launch(request(tmp_path, "true"))
    while launcher.status(handle).state == RunState.RUNNING:
        time.sleep(0.05)
    assert launcher.status(handle).state == RunState.SUCCEEDED


def test_a_claim_whose_launcher_is_gone_is_taken_over_at_once(tmp_path):
    """A broker killed between claiming a node and starting it: the next one
    waited 5 s for that node, and brokers killed every few seconds each waited
    so until none lived to start it (the killed-brokers test, one job LAUNCHING
    for four minutes). A claim names its launcher; a gone one's is taken over."""
    import subprocess
    import sys

    run_dir = tmp_path / "runs" / "7"
    run_dir.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    started = start_time(dead.pid)
    dead.wait()
    (run_dir / "node-0.claim").write_text(f"{dead.pid} {started}")  # it claimed, then was killed
    launcher = LocalLauncher(tmp_path, 1)
    began = time.monotonic()
    handle = launcher.launch(request(tmp_path, "true"))
    assert time.monotonic() - began < 4, "the launch waited for a node a dead launcher never started"
    while launcher.status(handle).state == RunState.RUNNING:
        time.sleep(0.05)
    assert launcher.status(handle).state == RunState.SUCCEEDED
    assert (run_dir / "node-0.claim").read_text().split()[0] == str(os.getpid())  # the claim is the taker's now


def _wait_gone(pid: int, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while start_time(pid) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_terminate_ends_every_process_of_the_node_whatever_its_session(tmp_path):
    """Like torchrun's workers, a process in a session of its own is still the node's."""
    launcher = LocalLauncher(tmp_path, 1)
    pid_file = tmp_path / "worker.pid"
    handle = launcher.launch(request(tmp_path, f"setsid sleep 60 & echo $! > {pid_file}; wait"))
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    worker = int(pid_file.read_text())
    assert start_time(worker) is not None
    launcher.terminate(handle)
    assert _wait_gone(worker) and _wait_gone(handle["nodes"][0]["pid"])


def test_a_failed_setup_says_so_in_the_output_and_run_never_starts(tmp_path):
    """`setup` and `run` make one script: a failed setup read as the run's
    own "FAILED: exit code 1", with nothing to tell which had failed."""
    launcher = LocalLauncher(tmp_path, 1)
    handle = launcher.launch(replace(request(tmp_path, "echo the run ran"), setup="echo setting up; exit 3"))
    deadline = time.monotonic() + 10
    while launcher.status(handle).state == RunState.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert launcher.status(handle).exit_code == 3
    out = (tmp_path / "runs" / "7" / "node-0.out").read_text()
    assert "setting up\n" in out and "setup failed (exit code 3): run did not start" in out and "the run ran" not in out


def test_what_a_finished_job_left_running_ends_with_its_node(tmp_path):
    """A daemon the job double-forked is re-parented to the node, not to init,
    and does not outlive the run."""
    launcher = LocalLauncher(tmp_path, 1)
    pid_file = tmp_path / "daemon.pid"
    handle = launcher.launch(request(tmp_path, f"(setsid sleep 60 & echo $! > {pid_file}); exit 3"))
    deadline = time.monotonic() + 10
    while launcher.status(handle).state == RunState.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert launcher.status(handle).exit_code == 3
    assert _wait_gone(int(pid_file.read_text()))


def test_a_multi_node_run_fails_when_one_node_fails_as_on_skypilot(tmp_path):
    """One node's non-zero exit fails the run and stops the others, as
    SkyPilot does: the nodes still running (a torchrun waiting for its peer)
    once kept the attempt RUNNING, and paid for, without end."""
    launcher = LocalLauncher(tmp_path, 2)
    req = request(tmp_path, 'if [ "$SKYPILOT_NODE_RANK" = 1 ]; then exit 3; fi; sleep 60')
    handle = launcher.launch(replace(req, num_nodes=2))
    try:
        deadline = time.monotonic() + 10
        while launcher.status(handle).state == RunState.RUNNING:
            assert time.monotonic() < deadline, "still RUNNING with a failed node"
            time.sleep(0.05)
        status = launcher.status(handle)
        assert (status.state, status.exit_code) == (RunState.FAILED, 3)
        assert _wait_gone(handle["nodes"][0]["pid"])
    finally:
        launcher.terminate(handle)


def test_no_secret_of_a_node_stays_on_the_brokers_disk_once_it_has_started(tmp_path):
    """The node's spec carries the job's secrets and storage credentials: the
    node reads it once and removes it, so that a run's directory kept after the
    job (for its logs and exit codes) holds none of them."""
    launcher = LocalLauncher(tmp_path, 1)
    req = replace(request(tmp_path, "sleep 0.2"), secrets={"HF_TOKEN": "hf-secret-value"},
                  storage_env={"AWS_SECRET_ACCESS_KEY": "scoped-secret-value"})
    handle = launcher.launch(req)
    deadline = time.monotonic() + 10
    while launcher.status(handle).state == RunState.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert launcher.status(handle).state == RunState.SUCCEEDED
    kept = [p for p in (tmp_path / "runs").rglob("*") if p.is_file()
            and any(s in p.read_bytes() for s in (b"hf-secret-value", b"scoped-secret-value"))]
    assert kept == []


def test_a_failed_multi_node_run_is_judged_once_every_node_has_ended(tmp_path):
    """A peer's failure is often the echo of a node being lost whose agent is
    still reporting the notice (it does so before its node ends): the run
    stays RUNNING until the stopped nodes are down, and the exit code is the
    first failure's, not the stop's."""
    launcher = LocalLauncher(tmp_path, 10)
    ready, ended = tmp_path / "node-0-ready", tmp_path / "node-0-ended"
    req = request(tmp_path, f'if [ "$SKYPILOT_NODE_RANK" = 1 ]; then while [ ! -e {ready} ]; do sleep 0.05; done; '
                            f"exit 3; fi; trap 'sleep 1; touch {ended}; exit 143' TERM; touch {ready}; "
                            "sleep 60 & wait")
    handle = launcher.launch(replace(req, num_nodes=2))
    try:
        deadline = time.monotonic() + 15
        while (status := launcher.status(handle)).state == RunState.RUNNING:
            assert time.monotonic() < deadline, "still RUNNING with every node down"
            time.sleep(0.05)
        assert ended.exists(), "judged while node 0 was still stopping"
        assert (status.state, status.exit_code) == (RunState.FAILED, 3)
    finally:
        launcher.terminate(handle)


def test_a_node_stopped_while_it_starts_ends_with_a_code_and_never_vanishes(tmp_path):
    """A stop can come before the node's interpreter is up (a peer failed at
    once): the node takes it when it can, and its run ends stopped (143),
    never GONE, which the broker would take for a lost node to recover."""
    launcher = LocalLauncher(tmp_path, 10)
    marker = tmp_path / "ran"
    handle = launcher.launch(request(tmp_path, f"touch {marker}; sleep 60"))
    launcher.terminate(handle)  # at once: the node has not started Python yet
    deadline = time.monotonic() + 15
    while (status := launcher.status(handle)).state == RunState.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert (status.state, status.exit_code) == (RunState.FAILED, 143)
    assert not marker.exists()  # the job itself never started


def _simulators_of(node_pid: int) -> list[int]:
    return [pid for pid, argv in processes("cmdline")
            if b"spotbroker.agent.metadata_sim" in argv and str(node_pid).encode() in argv and start_time(pid)]


def test_a_node_stopped_while_it_starts_leaves_no_simulator_behind(tmp_path):
    """The stop is taken once the node can: it starts nothing more (its
    metadata simulator once outlived it, found by the suite's leftover check)."""
    launcher = LocalLauncher(tmp_path, 10)
    aws = replace(LOCAL_PLACEMENT, cloud="aws", region="us-east-1", zone="us-east-1a")
    req = replace(request(tmp_path, "sleep 60"), placement=aws,
                  extra_env={protocol.ENV_AGENT_TOKEN: "agent-token", protocol.ENV_BROKER_URL: "http://127.0.0.1:9"})
    handle = launcher.launch(req)
    launcher.terminate(handle)
    deadline = time.monotonic() + 15
    while (status := launcher.status(handle)).state == RunState.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert (status.state, status.exit_code) == (RunState.FAILED, 143)
    assert _simulators_of(handle["nodes"][0]["pid"]) == []


def test_a_notice_asked_for_as_soon_as_the_launch_returns_reaches_the_node(tmp_path):
    """The node starts its metadata simulator after the launch returns: a
    notice asked for at once (the job already RUNNING) was refused with "no
    metadata simulator" on a loaded host (seen in CI)."""
    launcher = LocalLauncher(tmp_path, 10)
    aws = replace(LOCAL_PLACEMENT, cloud="aws", region="us-east-1", zone="us-east-1a")
    req = replace(request(tmp_path, "sleep 60"), placement=aws,
                  extra_env={protocol.ENV_AGENT_TOKEN: "agent-token", protocol.ENV_BROKER_URL: "http://127.0.0.1:9"})
    handle = launcher.launch(req)
    try:
        url = tmp_path / "runs" / "7" / "sim.url"
        assert not url.exists() or "\n" not in url.read_text()  # not listening yet
        assert launcher.simulate_preemption(handle) is not None
    finally:
        launcher.terminate(handle)
        deadline = time.monotonic() + 15
        while launcher.status(handle).state == RunState.RUNNING and time.monotonic() < deadline:
            time.sleep(0.05)


def test_a_job_without_a_simulator_is_refused_at_once(tmp_path):
    launcher = LocalLauncher(tmp_path, 10)
    handle = launcher.launch(request(tmp_path, "sleep 60"))
    try:
        started = time.monotonic()
        with pytest.raises(LaunchError, match="no metadata simulator"):
            launcher.simulate_preemption(handle)
        assert time.monotonic() - started < 1
    finally:
        launcher.terminate(handle)


def test_a_node_lost_before_it_started_the_job_is_a_failed_start_not_a_vanished_node(tmp_path):
    """The broker recovers a vanished node as a reclaim, without bound; a
    node that ends before the job's command started is a failed launch,
    which the broker tries again a bounded number of times."""
    launcher = LocalLauncher(tmp_path, 10)
    aws = replace(LOCAL_PLACEMENT, cloud="aws", region="us-east-1", zone="us-east-1a")
    marker = tmp_path / "ran"
    req = replace(request(tmp_path, f"touch {marker}; sleep 60"), placement=aws,
                  extra_env={protocol.ENV_AGENT_TOKEN: "agent-token", protocol.ENV_BROKER_URL: "http://127.0.0.1:9"})
    handle = launcher.launch(req)
    run_dir, node = tmp_path / "runs" / "7", handle["nodes"][0]
    deadline = time.monotonic() + 15
    while not (run_dir / "node-0.self").exists():  # up, and starting its simulator
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.killpg(node["pid"], signal.SIGKILL)  # lost while it provisions: no record of any kind
    assert _wait_gone(node["pid"])
    status = launcher.status(handle)
    assert (status.state, status.error) == (RunState.FAILED, "node 0 ended before the job's command started")
    assert not marker.exists()


def test_a_node_lost_once_its_job_runs_vanished(tmp_path):
    launcher = LocalLauncher(tmp_path, 10)
    handle = launcher.launch(request(tmp_path, "sleep 60"))
    node = handle["nodes"][0]
    deadline = time.monotonic() + 15
    while not (tmp_path / "runs" / "7" / "started-0").exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(node["pid"], signal.SIGKILL)
    assert _wait_gone(node["pid"])
    assert launcher.status(handle).state == RunState.GONE


def test_the_nodes_of_an_attempt_meet_on_one_free_port_of_its_own(tmp_path):
    """Every node of a local attempt is this host: a port the job made from its
    attempt's id (which another broker's database repeats) was once taken, and
    the next attempt's trainers exited 1 as it resumed. Each attempt of several
    nodes gets a free port, the same on every node, as MASTER_ADDR/MASTER_PORT."""
    import socket

    launcher = LocalLauncher(tmp_path, 2)
    req = replace(request(tmp_path, f'echo "$MASTER_ADDR:$MASTER_PORT" > {tmp_path}/meet-$SKYPILOT_NODE_RANK'),
                  num_nodes=2)
    seen = []
    for attempt_id in (7, 8):
        handle = launcher.launch(replace(req, attempt_id=attempt_id))
        deadline = time.monotonic() + 15
        while launcher.status(handle).state == RunState.RUNNING:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert launcher.status(handle).state == RunState.SUCCEEDED
        meets = {(tmp_path / f"meet-{rank}").read_text().strip() for rank in (0, 1)}
        assert len(meets) == 1, meets  # both nodes agree
        addr, port = meets.pop().split(":")
        assert addr == "127.0.0.1" and 1024 <= int(port) < 65536
        with socket.socket() as s:
            s.bind(("", int(port)))  # free once the attempt has ended
        seen.append(int(port))
    assert launcher.job_env(req, 0, tmp_path, False)["MASTER_PORT"] == str(seen[0])  # kept for a relaunch
    assert "MASTER_PORT" not in launcher.job_env(replace(req, num_nodes=1, attempt_id=9), 0, tmp_path, False)


def test_a_job_gets_skypilots_task_id_and_cluster_info_the_same_on_every_node_and_attempt(tmp_path):
    """Upstream recipes pass `--rdzv_id $SKYPILOT_TASK_ID` to torchrun and name
    files in a shared /tmp by it: it was empty on the local launcher (torchrun
    then took the script's name for the id and had no script)."""
    launcher = LocalLauncher(tmp_path, 2)
    req = replace(request(tmp_path, f'printf %s "$SKYPILOT_TASK_ID" > {tmp_path}/id-$SKYPILOT_NODE_RANK-$A; '
                                    f'printf %s "$SKYPILOT_CLUSTER_INFO" > {tmp_path}/info-$SKYPILOT_NODE_RANK-$A'),
                  num_nodes=2)
    for attempt_id in (7, 8):
        handle = launcher.launch(replace(req, attempt_id=attempt_id, envs={"A": str(attempt_id)}))
        deadline = time.monotonic() + 15
        while launcher.status(handle).state == RunState.RUNNING:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert launcher.status(handle).state == RunState.SUCCEEDED
    ids = {(tmp_path / f"id-{rank}-{a}").read_text() for rank in (0, 1) for a in (7, 8)}
    assert ids == {f"spotbroker-job-{req.job_id}"}
    info = json.loads((tmp_path / "info-1-8").read_text())
    assert info["num_nodes"] == 2 and info["cloud"] == req.placement.cloud and info["cluster_name"]


def test_a_job_finds_its_workdir_where_skypilot_puts_it(tmp_path):
    """Recipes `cd ~/sky_workdir`, where SkyPilot puts a task's workdir: it was not there."""
    launcher = LocalLauncher(tmp_path, 1)
    handle = launcher.launch(request(tmp_path, f"cd ~/sky_workdir && pwd -P > {tmp_path}/where"))
    deadline = time.monotonic() + 15
    while launcher.status(handle).state == RunState.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert launcher.status(handle).state == RunState.SUCCEEDED
    assert (tmp_path / "where").read_text().strip().endswith("/node-0/workdir")


def test_a_node_that_ended_is_no_zombie_even_if_this_broker_never_asks_after_it(tmp_path):
    """With two brokers on one database, the other one may see the run end and
    release it: the node stayed <defunct> under the broker that started it."""
    launcher = LocalLauncher(tmp_path, 1)
    pid = launcher.launch(request(tmp_path, "true"))["nodes"][0]["pid"]
    deadline = time.monotonic() + 20
    while _state(pid) != "gone":  # never status() or terminate(): only the other broker did
        assert time.monotonic() < deadline, f"node {pid} is {_state(pid)}"
        time.sleep(0.05)


def _state(pid: int) -> str | None:
    """The process's state letter (Z: a zombie), "gone" once collected."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"
