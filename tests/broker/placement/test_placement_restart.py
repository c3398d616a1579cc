"""What placement knows of a reclaim is read from the database: a broker
restarted between a preemption notice and the recovery places the job where
a live one would have (not back in the zone just reclaimed)."""
from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from support.helpers import submit

from spotbroker.broker.clock import Clock
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.jobs.states import EndReason
from spotbroker.broker.launch.local import LocalLauncher
from spotbroker.broker.placement.placer import attempt_key
from spotbroker.broker.placement.policy import Action
from spotbroker.broker.reconciler import Reconciler
from spotbroker.broker.recovery import agent_channel
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Job
from spotbroker.broker.usecases import jobs

T4 = {"accelerators": "T4:1"}


class ShiftedClock(Clock):
    """The real clock, shifted forward on demand (a broker that was down a while)."""

    def __init__(self) -> None:
        self.shift = timedelta()

    def now(self):
        return super().now() + self.shift


def run_until(rec: Reconciler, factory, job_id: int, states: set[str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec.pass_once()
        with factory() as s:
            if s.get(Job, job_id).state in states:
                return
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not reach {states}")


def _attempts(factory, job_id):
    with factory() as s:
        return list(s.scalars(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.id)))


def test_a_broker_restarted_between_a_notice_and_the_recovery_places_the_job_as_a_live_one_would(env):
    factory, settings, team = env
    clock = ShiftedClock()
    launcher = LocalLauncher(settings.data_dir, 1, agent=False)
    live = Reconciler(factory, {"local": launcher}, settings, clock=clock)
    job_id = submit(factory, team, run="sleep 600", resources=T4)
    run_until(live, factory, job_id, {"RUNNING"})
    (first,) = _attempts(factory, job_id)
    assert first.use_spot
    reclaimed = attempt_key(first)
    with transaction(factory) as s:  # the zone has a long record: steadier than any zone never tried
        old = s.get(Attempt, first.id)
        earlier = clock.now() - timedelta(hours=30)
        s.add(Attempt(job_id=job_id, state="PREEMPTED", reason="moved", end_reason=EndReason.MOVED,
                      launcher="local", cloud=old.cloud, region=old.region, zone=old.zone, zone_id=old.zone_id,
                      instance_type=old.instance_type, accelerator=old.accelerator,
                      accelerator_count=old.accelerator_count, use_spot=True, num_nodes=1,
                      price_per_hour=old.price_per_hour, created_at=earlier, updated_at=earlier,
                      started_at=earlier, ended_at=earlier + timedelta(hours=20), released=True))
    event = agent_channel.AgentEvent
    with transaction(factory) as s:  # the cloud's notice, then the agent's word that no flush will come
        attempt = s.get(Attempt, first.id)
        agent_channel.record(s, attempt, [event(1, "preemption_notice", datetime.now(UTC),
                                                {"cloud": "aws", "kind": "preemption"})],
                             settings.checkpoint_uri, clock)
        agent_channel.record(s, attempt, [event(2, "no_flush", datetime.now(UTC), {"reason": "no library"})],
                             settings.checkpoint_uri, clock)
    with factory() as s:
        job = s.get(Job, job_id)
        assert job.state == "RECOVERING"
        # what the live broker would do now, at its next pass
        live.placer.new_pass()
        choice = live.placer.choose(s, job, JobSpec.model_validate(job.spec), clock.now())
    assert choice.action is Action.LAUNCH and choice.placements[0].use_spot
    # The broker dies; another starts once the dead one's lease on the job has
    # expired and it has waited a heartbeat timeout for its agents.
    clock.shift = timedelta(seconds=settings.lease_seconds + settings.heartbeat_timeout + 30)
    restarted = Reconciler(factory, {"local": LocalLauncher(settings.data_dir, 1, agent=False)}, settings,
                           clock=clock)
    run_until(restarted, factory, job_id, {"LAUNCHING", "RUNNING"})
    recovered = _attempts(factory, job_id)[-1]
    assert recovered.id != first.id
    assert attempt_key(recovered) != reclaimed
    assert (recovered.cloud, recovered.region, recovered.zone, recovered.instance_type) == (
        choice.placements[0].cloud, choice.placements[0].region, choice.placements[0].zone,
        choice.placements[0].instance_type)
    with transaction(factory) as s:
        jobs.cancel(s, team, job_id)
    restarted.pass_once()
