"""A run that ends well while the broker drains it for a move: the agent's
word that no flush will come ("the trainer had already exited") must not
run the job again from its start; the launcher's end of the run makes the
job SUCCEEDED. (The drain test, tests/e2e/test_preemption.py, met this race
once on a loaded machine: its second attempt started from step 0.)"""
from __future__ import annotations

from support.world import T0, FakeClock, World

from spotbroker.agent import protocol
from spotbroker.broker.jobs.runs import RunState, RunStatus
from spotbroker.broker.recovery import attempts as recovery
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Event, Job


def moving(factory, team: str) -> tuple[int, int, FakeClock]:
    """A job whose one-node attempt the broker drains for a move: (job, attempt, clock)."""
    world = World(factory)
    job_id = world.job(world.team(team))
    attempt_id = world.attempt(job_id)
    clock = FakeClock(T0)
    with transaction(factory) as s:
        job, attempt = s.get(Job, job_id), s.get(Attempt, attempt_id)
        recovery.start_move(s, job, attempt, "deadline", ["aws/us-east-1 on-demand"], 180.0, clock)
    return job_id, attempt_id, clock


def test_a_run_that_ended_during_a_drain_succeeds_on_exit_0_and_is_recovered_otherwise(factory):
    for exit_code in (0, 1):
        job_id, attempt_id, clock = moving(factory, f"team{exit_code}")
        with transaction(factory) as s:
            job, attempt = s.get(Job, job_id), s.get(Attempt, attempt_id)
            s.add(Event(job_id=job_id, attempt_id=attempt_id, type=protocol.TRAINER_EXITED, at=clock.now(),
                        data={"exit_code": exit_code}))
            said = {"reason": "the trainer had already exited"}
            changed = recovery.on_agent_event(s, job, attempt, protocol.NO_FLUSH, said, clock)
            if exit_code:  # recovered from what is committed
                assert changed and (job.state, attempt.state, attempt.end_reason) == (
                    "RECOVERING", "PREEMPTED", "moved")
                continue
            assert not changed and job.state == "PREEMPTING"  # (it was RECOVERING: run again from step 0)
            recovery.on_status(s, job, attempt_id, RunStatus(RunState.SUCCEEDED, exit_code=0), clock)
            assert (job.state, attempt.state) == ("SUCCEEDED", "SUCCEEDED")
