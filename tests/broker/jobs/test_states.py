"""One transition table per machine; one function writes state and event together."""
import pytest
from sqlalchemy import select

from spotbroker.broker import auth
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.jobs.states import (
    ATTEMPT_TRANSITIONS,
    JOB_TRANSITIONS,
    TERMINAL_JOB_STATES,
    IllegalTransition,
    JobState,
    transition,
)
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Event, Job
from spotbroker.broker.usecases import jobs


def make_job(factory) -> int:
    with transaction(factory) as s:
        team, _ = auth.create_team(s, "ml")
        return jobs.submit(s, team.id, JobSpec(run="true")).id


def test_tables_cover_every_state():
    assert set(JOB_TRANSITIONS) == set(JobState)
    assert TERMINAL_JOB_STATES == {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
    assert all(not ATTEMPT_TRANSITIONS[s] for s in ("SUCCEEDED", "FAILED", "PREEMPTED", "CANCELLED"))


def test_transition_writes_state_and_event_in_one_transaction(factory):
    job_id = make_job(factory)
    with pytest.raises(RuntimeError):
        with transaction(factory) as s:
            transition(s, s.get(Job, job_id), JobState.LAUNCHING, reason="x")
            raise RuntimeError("crash before commit")
    with factory() as s:
        assert s.get(Job, job_id).state == "PENDING"
        assert [e.type for e in s.scalars(select(Event).where(Event.job_id == job_id))] == ["submitted"]
    with transaction(factory) as s:
        transition(s, s.get(Job, job_id), JobState.LAUNCHING, reason="placed")
    with factory() as s:
        events = list(s.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.id)))
        assert events[-1].type == "job_state"
        assert events[-1].data == {"from": "PENDING", "to": "LAUNCHING", "reason": "placed"}
        assert events[-1].at.tzinfo is not None


def test_illegal_transition_raises_and_writes_nothing(factory):
    job_id = make_job(factory)
    with pytest.raises(IllegalTransition, match="PENDING -> RUNNING"):
        with transaction(factory) as s:
            transition(s, s.get(Job, job_id), JobState.RUNNING)
    with transaction(factory) as s:
        job = s.get(Job, job_id)
        transition(s, job, JobState.CANCELLED)
        assert job.ended_at is not None
    with pytest.raises(IllegalTransition):
        with transaction(factory) as s:
            transition(s, s.get(Job, job_id), JobState.PENDING)


def test_a_job_that_runs_again_or_succeeds_drops_the_reason_it_waited_or_recovered_for(factory):
    """`spotbroker job` showed "SUCCEEDED (preempted: checkpoint committed)"
    for a job that recovered and then succeeded."""
    job_id = make_job(factory)
    J = JobState
    with transaction(factory) as s:
        job = s.get(Job, job_id)
        for to, reason in ((J.LAUNCHING, None), (J.RUNNING, None), (J.PREEMPTING, "preemption notice"),
                           (J.RECOVERING, "preempted: checkpoint committed"), (J.LAUNCHING, None)):
            transition(s, job, to, reason=reason)
        assert job.reason == "preempted: checkpoint committed"  # still what it waits on while launching
        transition(s, job, J.RUNNING)
        assert job.reason is None
        transition(s, job, J.SUCCEEDED, reason="early_stopped")
        assert job.reason == "early_stopped"  # an end that says why keeps it
