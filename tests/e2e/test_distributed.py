"""Distributed training survives a preemption: torchrun's workers, sharded
state, and a notice on one node of two.

Through the real server, the local launcher's nodes and their agents, the
metadata simulator and the checkpoint library, on CPU with gloo: every rank
flushes the same step, the next attempt resumes there, and the run ends with
the loss of an uninterrupted one. SQLite only (the node side; the database
side of recovery runs on both elsewhere).
"""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from e2e.test_job_shapes import assert_flushed_and_resumed, copy_in, final_loss, preempt_once_stepping
from support.helpers import once_per_run, timeline, wait_for, wait_state

from spotbroker.agent import proctree
from spotbroker.broker.launch.local_node import sim_token_file, sim_url_file

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]
DDP = Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"
ARGS = "--steps 60 --seed 3 --every-steps 1000 --log-every 1 --step-seconds 0.15"
TORCHRUN = "python -m torch.distributed.run"
RESOURCES = {"accelerators": "T4:1", "infra": "aws"}
# Two nodes of one: where they meet is the launcher's MASTER_ADDR and MASTER_PORT, the attempt's own.
MEET = ("--nnodes=2 --nproc_per_node=1 --node_rank=$SKYPILOT_NODE_RANK --master_addr=$MASTER_ADDR "
        "--master_port=$MASTER_PORT")


@pytest.fixture(scope="module")
def uninterrupted_loss(tmp_path_factory) -> str:
    """Two ranks, never stopped: replicated, sharded or across two nodes, the same training."""
    def run() -> str:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                               str(DDP), *shlex.split(ARGS.replace("--step-seconds 0.15", ""))],
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        return final_loss(done.stdout)

    return once_per_run(tmp_path_factory, "distributed-loss", run)


def submit(api, h, name: str, run: str, num_nodes: int = 1) -> int:
    # The trainer's own every_steps (the tests time its saves), not the interval fitted to the zone.
    r = api.post("/v1/jobs", json={"name": name, "setup": copy_in(DDP), "run": run, "num_nodes": num_nodes,
                                   "resources": RESOURCES, "checkpoint": {"interval": "code"}}, headers=h)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def events_of(api, h, job_id: int) -> list[dict]:
    return api.get(f"/v1/jobs/{job_id}/events", headers=h).json()["events"]


def explain(api, h, job_id: int, settings, kept: Path) -> str:
    """What a failed run shows: its timeline, each attempt's log and each
    node's own output (its agent's lines and the trainer's), the tails
    printed and the whole kept under `kept` (the data directory is removed
    with the test)."""
    parts = [timeline(api, h, job_id)]
    for attempt in api.get(f"/v1/jobs/{job_id}", headers=h).json()["attempts"]:
        log = api.get(f"/v1/jobs/{job_id}/logs", params={"attempt": attempt["id"]}, headers=h).text
        parts.append(f"--- attempt {attempt['id']} ({attempt['state']}, {attempt['reason']}): its log's tail\n"
                     + "\n".join(log.splitlines()[-40:]))
        run_dir = Path(settings.data_dir) / "runs" / str(attempt["id"])
        for out in sorted(run_dir.glob("node-*.out")) + sorted(run_dir.glob("node-*/agent/*.log")):
            text = out.read_text(errors="replace")
            copy = kept / str(attempt["id"]) / out.relative_to(run_dir)
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(text)
            parts.append(f"--- {out.relative_to(run_dir.parent)} (kept: {copy}): its tail\n"
                         + "\n".join(text.splitlines()[-40:]))
    return "\n".join(parts)


def assert_one_flush_for_every_rank(api, h, job: dict, ranks: int, layout: str = "stream") -> None:
    """The flushed checkpoint holds every rank's part, all of one step."""
    from spotbroker.agent.checkpoint.format import read_manifest
    from spotbroker.agent.checkpoint.storage import Storage

    first = job["attempts"][0]
    flush = [e for e in events_of(api, h, job["id"])
             if e["type"] == "checkpoint_committed" and e["attempt_id"] == first["id"]][-1]
    manifest = read_manifest(Storage(flush["data"]["uri"]))
    assert manifest["world_size"] == ranks and manifest.get("layout", "stream") == layout
    assert {f"rank-{r:05d}.pkl" for r in range(ranks)} <= set(manifest["objects"])


@pytest.mark.parametrize("layout", ["replicated", "sharded"])
def test_torchrun_workers_flush_one_step_and_resume_there(api, team_headers, uninterrupted_loss, layout):
    h = team_headers()
    flag = " --sharded" if layout == "sharded" else ""
    job_id = submit(api, h, f"ddp-{layout}",
                    f"{TORCHRUN} --standalone --nproc_per_node=2 ddp_train.py {ARGS}{flag}")
    job = preempt_once_stepping(api, h, job_id)
    assert_flushed_and_resumed(api, h, job)
    assert_one_flush_for_every_rank(api, h, job, ranks=2, layout="sharded" if flag else "stream")
    assert final_loss(api.get(f"/v1/jobs/{job_id}/logs", headers=h).text) == uninterrupted_loss


def test_a_notice_on_the_second_node_flushes_both_and_the_job_resumes_once(api, team_headers, settings,
                                                                           uninterrupted_loss, tmp_path):
    h = team_headers()
    # The launcher's rendezvous for the attempt (broker/launch/local_rendezvous.py): a port made from the
    # attempt's id was once taken (another worker's attempt of the same id), and the second attempt failed.
    run = f"{TORCHRUN} {MEET} ddp_train.py {ARGS}"
    job_id = submit(api, h, "two-nodes", run, num_nodes=2)
    wait_state(api, h, job_id, {"RUNNING"}, timeout=60)
    wait_for(lambda: "step=5 " in api.get(f"/v1/jobs/{job_id}/logs", headers=h).text, timeout=60,
             what="training to be under way")
    attempt_id = api.get(f"/v1/jobs/{job_id}", headers=h).json()["attempts"][0]["id"]
    run_dir = Path(settings.data_dir) / "runs" / str(attempt_id)
    sim_url = (run_dir / sim_url_file(1)).read_text().split("\n", 1)[0]
    token = (run_dir / sim_token_file(1)).read_text().strip()  # the simulator takes orders from the broker only
    httpx.post(f"{sim_url}/_sim/preempt", json={"notice_seconds": 5}, headers={"X-Sim-Token": token},
               timeout=5).raise_for_status()
    job = wait_state(api, h, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=150)
    assert job["state"] == "SUCCEEDED", explain(api, h, job_id, settings, tmp_path)
    assert len(job["attempts"]) == 2, explain(api, h, job_id, settings, tmp_path)  # preempted once, recovered once
    events = events_of(api, h, job_id)
    notices = [e for e in events if e["type"] == "preemption_notice" and e["data"].get("kind") != "drain"]
    assert [e["data"].get("node") for e in notices] == [1]  # node 1's own notice, and only it
    preempting = [e for e in events if e["type"] == "job_state" and e["data"]["to"] == "PREEMPTING"]
    assert len(preempting) == 1  # the job is preempted once, whichever node heard it
    assert_flushed_and_resumed(api, h, job)
    assert_one_flush_for_every_rank(api, h, job, ranks=2)
    assert final_loss(api.get(f"/v1/jobs/{job_id}/logs", headers=h).text) == uninterrupted_loss


def test_a_node_that_vanishes_without_a_notice_recovers_the_job_from_its_newest_checkpoint(
        api, team_headers, settings, uninterrupted_loss):
    """Node 1 of two ends at once, no notice given (its every process, as the
    simulator's hard stop does): node 0 is stopped too, the job recovers, and
    the next attempt starts at the newest step committed before the loss."""
    h = team_headers()
    run = f"{TORCHRUN} {MEET} ddp_train.py {ARGS.replace('--every-steps 1000', '--every-steps 10')}"
    job_id = submit(api, h, "node-vanishes", run, num_nodes=2)
    wait_state(api, h, job_id, {"RUNNING"}, timeout=60)
    first = api.get(f"/v1/jobs/{job_id}", headers=h).json()["attempts"][0]

    def committed() -> list[dict]:
        return [e for e in events_of(api, h, job_id)
                if e["type"] == "checkpoint_committed" and e["attempt_id"] == first["id"]]

    wait_for(lambda: committed(), timeout=60, what="a periodic checkpoint of the first attempt")
    run_dir = Path(settings.data_dir) / "runs" / str(first["id"])
    node_1 = (run_dir / "node-1.self").read_text().split()
    assert proctree.kill_tree(int(node_1[0])) > 0  # no notice: the node is simply gone
    lost_at = len(committed())
    job = wait_state(api, h, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=150)
    assert job["state"] == "SUCCEEDED", timeline(api, h, job_id)
    assert len(job["attempts"]) == 2, job["attempts"]
    lost, second = job["attempts"]
    assert (lost["state"], lost["reason"]) == ("PREEMPTED", "vanished")
    events = events_of(api, h, job_id)
    assert not [e for e in events if e["type"] == "preemption_notice"]
    moves = [e["data"]["to"] for e in events if e["type"] == "job_state"]
    assert moves[moves.index("RUNNING"):][:3] == ["RUNNING", "RECOVERING", "LAUNCHING"], moves
    # Node 0 was stopped with its attempt: no process of the lost attempt is left.
    node_0 = (run_dir / "node-0.self").read_text().split()
    wait_for(lambda: proctree.start_time(int(node_0[0])) != node_0[1], timeout=30, what="node 0 to be stopped")
    newest = committed()[-1]
    assert len(committed()) in (lost_at, lost_at + 1)  # a save under way when node 1 went may have committed
    resumed = next(e for e in events if e["type"] == "resumed" and e["attempt_id"] == second["id"])
    assert resumed["data"]["step"] == newest["data"]["step"] > 0
    logs = api.get(f"/v1/jobs/{job_id}/logs", params={"attempt": second["id"]}, headers=h).text
    assert f"start_step={newest['data']['step']}" in logs
    assert final_loss(api.get(f"/v1/jobs/{job_id}/logs", headers=h).text) == uninterrupted_loss
