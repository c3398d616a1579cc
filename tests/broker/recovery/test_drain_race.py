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


def test_a_run_that_ended_well_during_a_drain_ends_the_job_succeeded(factory):
    world = World(factory)
    job_id = world.job(world.team())
    attempt_id = world.attempt(job_id)
    clock = FakeClock(T0)
    with transaction(factory) as s:
        job, attempt = s.get(Job, job_id), s.get(Attempt, attempt_id)
        recovery.start_move(s, job, attempt, "deadline", ["aws/us-east-1 on-demand"], 180.0, clock)
    with transaction(factory) as s:
        job, attempt = s.get(Job, job_id), s.get(Attempt, attempt_id)
        s.add(Event(job_id=job_id, attempt_id=attempt_id, type=protocol.TRAINER_EXITED, at=clock.now(),
                    data={"exit_code": 0}))
        said = {"reason": "the trainer had already exited"}
        assert recovery.on_agent_event(s, job, attempt, protocol.NO_FLUSH, said, clock) is False
        assert job.state == "PREEMPTING"  # (it was RECOVERING: the job ran again from step 0)
        recovery.on_status(s, job, attempt_id, RunStatus(RunState.SUCCEEDED, exit_code=0), clock)
        assert (job.state, attempt.state) == ("SUCCEEDED", "SUCCEEDED")


def test_a_run_that_failed_during_a_drain_is_recovered_from_what_is_committed(factory):
    world = World(factory)
    job_id = world.job(world.team())
    attempt_id = world.attempt(job_id)
    clock = FakeClock(T0)
    with transaction(factory) as s:
        job, attempt = s.get(Job, job_id), s.get(Attempt, attempt_id)
        recovery.start_move(s, job, attempt, "deadline", ["aws/us-east-1 on-demand"], 180.0, clock)
        s.add(Event(job_id=job_id, attempt_id=attempt_id, type=protocol.TRAINER_EXITED, at=clock.now(),
                    data={"exit_code": 1}))
        assert recovery.on_agent_event(s, job, attempt, protocol.NO_FLUSH, {"reason": "gone"}, clock) is True
        assert (job.state, attempt.state, attempt.end_reason) == ("RECOVERING", "PREEMPTED", "moved")
