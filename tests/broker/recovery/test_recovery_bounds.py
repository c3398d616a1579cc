"""Every way back to RECOVERING has an end. A node that fails to start the
job's command (the kernel refuses its environment with E2BIG) is a failed
launch, tried again after a back-off a bounded number of times, then the job
fails with the cause: it was taken for a vanished node and relaunched 40
times a minute for ever, `max_restarts: 0` notwithstanding. Nodes that
vanish again and again wait longer each time, and reclaims are bounded per
job. Driven pass by pass on the real local launcher and both databases."""
from __future__ import annotations

import os
import signal
import time

import pytest
from sqlalchemy import select
from support.helpers import submit

from spotbroker.broker.launch.local import LocalLauncher
from spotbroker.broker.reconciler import Reconciler
from spotbroker.broker.store.models import Attempt, Event, Job


def reconciler(factory, settings) -> Reconciler:
    return Reconciler(factory, {"local": LocalLauncher(settings.data_dir, 1)}, settings)


def run_until(rec: Reconciler, factory, job_id: int, states: set[str], timeout: float = 20) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec.pass_once()
        with factory() as s:
            if (job := s.get(Job, job_id)).state in states:
                return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not reach {states}; it is {job.state} ({job.reason})")


def attempts(factory, job_id) -> list[Attempt]:
    with factory() as s:
        return list(s.scalars(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.id)))


def _waits(factory, job_id) -> list[float]:
    with factory() as s:
        return [e.data.get("wait_seconds", 0) for e in s.scalars(
            select(Event).where(Event.job_id == job_id, Event.type == "recovery_scheduled").order_by(Event.id))]


@pytest.mark.parametrize("oversized", [{"envs": {"BIG": "x" * 200_000}}, {"setup": "true # " + "x" * 200_000}],
                         ids=["env", "setup"])
def test_a_command_the_kernel_refuses_fails_its_launch_with_the_cause_after_bounded_retries(env, oversized):
    factory, settings, team = env
    settings.launch_retries, settings.launch_retry_seconds = 2, 0.2
    # Stored as a spec from before the submission bound (the API refuses it now).
    job_id = submit(factory, team, run="echo never", max_restarts=0, **oversized)
    job = run_until(reconciler(factory, settings), factory, job_id, {"FAILED", "SUCCEEDED"}, timeout=60)
    assert job.state == "FAILED" and "Argument list too long" in job.reason, job.reason
    ended = [(a.state, a.end_reason) for a in attempts(factory, job_id)]
    assert ended == [("FAILED", "launch_error")] * 3, ended  # the first launch and two retries, none "vanished"
    assert (job.recoveries, job.restarts) == (0, 0)
    assert _waits(factory, job_id) == [0.2, 0.4]  # a back-off, doubling


def _kill_node_once_running(rec, factory, job_id, n: int, marks) -> None:
    deadline = time.monotonic() + 30
    while not (len(found := attempts(factory, job_id)) == n and found[-1].state == "RUNNING"):
        assert time.monotonic() < deadline, [(a.state, a.reason) for a in found]
        rec.pass_once()
        time.sleep(0.05)
    attempt = found[-1]
    deadline = time.monotonic() + 10
    while not (marks / f"ran-{attempt.id}").exists():  # the job's command runs: a loss now is a reclaim
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(attempt.handle["nodes"][0]["pid"], signal.SIGKILL)  # lost: no exit code


def test_nodes_that_vanish_again_wait_longer_and_reclaims_are_bounded(env, job_scratch):
    factory, settings, team = env
    settings.launch_retry_seconds, settings.max_recoveries = 0.3, 1
    job_id = submit(factory, team, run=f"touch {job_scratch}/ran-$SPOTBROKER_ATTEMPT_ID; sleep 60")
    rec = reconciler(factory, settings)
    _kill_node_once_running(rec, factory, job_id, 1, job_scratch)
    _kill_node_once_running(rec, factory, job_id, 2, job_scratch)  # recovered at once, and lost again
    job = run_until(rec, factory, job_id, {"FAILED"}, timeout=30)
    assert [(a.state, a.end_reason) for a in attempts(factory, job_id)] == [("PREEMPTED", "vanished")] * 2
    assert job.reason.startswith("reclaimed 2 times, more than this broker recovers (SPOTBROKER_MAX_RECOVERIES=1)")
    assert _waits(factory, job_id) == [0, 0.3]  # the second in a row waited
    with factory() as s:
        assert s.get(Job, job_id).restarts == 0
