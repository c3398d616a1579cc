"""The reconciler, driven pass by pass: crash safety, recovery, caps, failover."""
from __future__ import annotations

import json
import os
import signal
import time
from datetime import timedelta

import pytest
from sqlalchemy import select
from support.helpers import submit

from spotbroker.broker.checkpoints.uris import attempt_prefix, checkpoint_uri
from spotbroker.broker.clock import Clock
from spotbroker.broker.launch.base import CapacityError
from spotbroker.broker.launch.local import LocalLauncher
from spotbroker.broker.reconciler import Reconciler
from spotbroker.broker.store.db import retrying, transaction
from spotbroker.broker.store.models import Attempt, Event, Job, Team
from spotbroker.broker.usecases import jobs


class ShiftedClock(Clock):
    """The real clock, shifted forward on demand (to expire leases)."""

    def __init__(self) -> None:
        self.shift = timedelta()

    def now(self):
        return super().now() + self.shift


class Crash(BaseException):
    """Stands for the process dying at that line (not caught like an Exception)."""


def reconciler(factory, settings, launcher=None, clock=None) -> Reconciler:
    return Reconciler(factory, {"local": launcher or LocalLauncher(settings.data_dir, 1)}, settings,
                      clock=clock or Clock())


def run_until(rec: Reconciler, factory, job_id: int, states: set[str], timeout: float = 20) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec.pass_once()
        with factory() as s:
            job = s.get(Job, job_id)
            if job.state in states:
                return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not reach {states}; it is {job.state}")


def attempts(factory, job_id) -> list[Attempt]:
    with factory() as s:
        return list(s.scalars(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.id)))


class CrashingLauncher(LocalLauncher):
    def __init__(self, data_dir, after_launch: bool) -> None:
        super().__init__(data_dir, 1)
        self.after_launch = after_launch

    def launch(self, request):
        if self.after_launch:
            super().launch(request)
        raise Crash()


@pytest.mark.parametrize("after_launch", [False, True], ids=["before-launch", "after-launch"])
def test_crash_during_launch_resumes_with_one_attempt_and_one_run(env, tmp_path, after_launch):
    factory, settings, team = env
    marker = tmp_path / "runs.txt"
    job_id = submit(factory, team, run=f"echo $SPOTBROKER_ATTEMPT_ID >> {marker}")
    clock = ShiftedClock()
    with pytest.raises(Crash):
        reconciler(factory, settings, CrashingLauncher(settings.data_dir, after_launch), clock).pass_once()
    with factory() as s:
        assert s.get(Job, job_id).state == "LAUNCHING"
    # A new broker process, after the dead one's lease has expired.
    clock.shift = timedelta(seconds=settings.lease_seconds + 1)
    job = run_until(reconciler(factory, settings, clock=clock), factory, job_id, {"SUCCEEDED"})
    (attempt,) = attempts(factory, job.id)
    time.sleep(0.1)
    assert marker.read_text().split() == [str(attempt.id)]


def test_a_live_lease_keeps_other_brokers_away(env):
    factory, settings, team = env
    job_id = submit(factory, team, run="true")
    with pytest.raises(Crash):
        reconciler(factory, settings, CrashingLauncher(settings.data_dir, False)).pass_once()
    other = reconciler(factory, settings)
    for _ in range(3):
        other.pass_once()
    with factory() as s:
        assert s.get(Job, job_id).state == "LAUNCHING" and len(attempts(factory, job_id)) == 1
    assert attempts(factory, job_id)[0].handle is None


def test_vanished_node_is_recovered_on_a_new_attempt(env, tmp_path):
    factory, settings, team = env
    marker = tmp_path / "first-run"
    job_id = submit(factory, team, run=f"if [ -e {marker} ]; then echo resumed; else touch {marker}; sleep 60; fi")
    rec = reconciler(factory, settings)
    run_until(rec, factory, job_id, {"RUNNING"})
    deadline = time.monotonic() + 10
    while not marker.exists():  # the first run has started its work
        assert time.monotonic() < deadline
        time.sleep(0.02)
    (first,) = attempts(factory, job_id)
    os.killpg(first.handle["nodes"][0]["pid"], signal.SIGKILL)  # the node is lost: no exit code
    job = run_until(rec, factory, job_id, {"SUCCEEDED"})
    states = [(a.state, a.reason) for a in attempts(factory, job_id)]
    assert states == [("PREEMPTED", "vanished"), ("SUCCEEDED", "exit 0")]
    assert job.recoveries == 1


def test_local_cap_keeps_the_rest_pending(env, tmp_path):
    factory, settings, team = env
    settings.local_max_running = 2
    ids = [submit(factory, team, run="sleep 0.5") for _ in range(5)]
    rec = reconciler(factory, settings)
    most = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rec.pass_once()
        with factory() as s:
            states = [s.get(Job, i).state for i in ids]
        most = max(most, sum(st in ("LAUNCHING", "RUNNING") for st in states))
        if all(st == "SUCCEEDED" for st in states):
            break
        time.sleep(0.02)
    assert all(st == "SUCCEEDED" for st in states) and most == 2


def test_multi_node_runs_one_process_per_node_with_skypilot_variables(env, tmp_path):
    factory, settings, team = env
    out = tmp_path / "nodes"
    out.mkdir()
    run = (f'echo "$SKYPILOT_NODE_RANK $SKYPILOT_NUM_NODES $(echo "$SKYPILOT_NODE_IPS" | wc -l)" '
           f'> {out}/$SKYPILOT_NODE_RANK')
    settings.local_max_running = 3  # nodes on this host at once (the default is its CPU count)
    job_id = submit(factory, team, run=run, num_nodes=3)
    run_until(reconciler(factory, settings), factory, job_id, {"SUCCEEDED"})
    assert sorted(p.read_text().split() for p in out.iterdir()) == [["0", "3", "3"], ["1", "3", "3"], ["2", "3", "3"]]


def test_the_local_cap_counts_nodes_and_holds_a_job_larger_than_it(env):
    """Each local node is processes on the broker's host: two 2-node jobs under
    a cap of 3 run one after the other, and a 4-node job is held, saying why."""
    factory, settings, team = env
    settings.local_max_running, settings.placement_interval = 3, 0.05
    pair = [submit(factory, team, run="sleep 0.5", num_nodes=2) for _ in range(2)]
    too_big = submit(factory, team, run="true", num_nodes=4)
    rec = reconciler(factory, settings)
    most, deadline = 0, time.monotonic() + 30
    while time.monotonic() < deadline:
        rec.pass_once()
        with factory() as s:
            states = [s.get(Job, i).state for i in pair]
            most = max(most, sum(a.num_nodes for a in s.scalars(select(Attempt).where(
                Attempt.state.in_(["LAUNCHING", "RUNNING"])))))
        if all(st == "SUCCEEDED" for st in states):
            break
        time.sleep(0.02)
    assert states == ["SUCCEEDED", "SUCCEEDED"] and most == 2
    held = run_until(rec, factory, too_big, {"HELD"})
    assert "4 nodes" in held.reason and "SPOTBROKER_LOCAL_MAX_RUNNING" in held.reason


class NoCapacityOnce(LocalLauncher):
    def __init__(self, data_dir) -> None:
        super().__init__(data_dir, 1)
        self.refused = []

    def launch(self, request):
        if not self.refused:
            self.refused.append(request.placement.place)
            raise CapacityError("InsufficientInstanceCapacity")
        return super().launch(request)


def test_capacity_error_fails_over_to_the_next_offer(env):
    factory, settings, team = env
    launcher = NoCapacityOnce(settings.data_dir)
    job_id = submit(factory, team, run="true", resources={"accelerators": "A10G:1"})
    run_until(reconciler(factory, settings, launcher), factory, job_id, {"SUCCEEDED"})
    first, second = attempts(factory, job_id)
    assert (first.state, first.reason) == ("FAILED", "no_capacity") and second.state == "SUCCEEDED"
    assert f"{first.cloud}/{first.region}/{first.zone or first.zone_id}" == launcher.refused[0]
    assert (second.cloud, second.region, second.zone_id) != (first.cloud, first.region, first.zone_id)
    assert second.price_per_hour >= first.price_per_hour


def test_no_feasible_offer_fails_with_a_reason(env):
    factory, settings, team = env
    job_id = submit(factory, team, run="true", resources={"accelerators": "NOSUCHGPU:3"})
    job = run_until(reconciler(factory, settings), factory, job_id, {"FAILED"})
    assert job.reason == "no_feasible_offer: no offer has NOSUCHGPU" and attempts(factory, job_id) == []
    # on Kubernetes alone, with no cluster configured (was a bare no_feasible_offer)
    job_id = submit(factory, team, run="true", resources={"accelerators": "H100:8", "infra": "k8s"})
    job = run_until(reconciler(factory, settings), factory, job_id, {"FAILED"})
    assert job.reason == "no_feasible_offer: no Kubernetes place is configured (SPOTBROKER_KUBERNETES_PLACES)"


def test_a_stored_spec_that_no_longer_validates_fails_its_job_saying_why(env):
    """A spec stored before a rule was tightened (here: a mount at the home
    itself, which a padded path once got past): the job stayed PENDING, and
    each pass logged a traceback."""
    factory, settings, team = env
    job_id = submit(factory, team, run="true")
    with transaction(factory) as s:
        s.get(Job, job_id).spec = {"run": "true", "file_mounts": {"~/": {"name": "bkt"}}}
    job = run_until(reconciler(factory, settings), factory, job_id, {"FAILED"}, timeout=5)
    assert job.reason.startswith("invalid_spec: file_mounts: ") and "'~/'" in job.reason, job.reason
    assert attempts(factory, job_id) == []


def test_a_step_failing_pass_after_pass_is_told_once_not_each_pass(env, monkeypatch, caplog):
    """A job whose step raised logged a traceback every pass (every 2 s)."""
    import logging

    factory, settings, team = env
    job_id = submit(factory, team, run="true")
    rec = reconciler(factory, settings)

    def broken(job, observed=None):
        raise RuntimeError("a bug in one job's step")

    monkeypatch.setattr(rec, "step", broken)
    with caplog.at_level(logging.INFO, logger="spotbroker.broker.reconciler"):
        for _ in range(5):
            rec.pass_once()
            with transaction(factory) as s:  # due again at once
                s.get(Job, job_id).next_check_at = rec.clock.now() - timedelta(seconds=1)
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert [r.getMessage() for r in tracebacks] == [f"step of job {job_id} failed"]
    # Cancelled while failing: its count is forgotten (it was kept until the broker restarted).
    assert job_id in rec._step_failures
    with transaction(factory) as s:
        s.get(Job, job_id).state = "CANCELLED"
    rec.pass_once()
    assert rec._step_failures == {}


def test_handle_survives_in_the_database(env):
    factory, settings, team = env
    job_id = submit(factory, team, run="true")
    run_until(reconciler(factory, settings), factory, job_id, {"SUCCEEDED"})
    (a,) = attempts(factory, job_id)
    assert a.handle["nodes"][0]["pid"] > 0 and json.dumps(a.handle)


def test_a_launch_whose_handle_was_lost_is_found_even_after_the_agent_said_running(env, tmp_path):
    """A broker dies after launching but before storing the handle; the agent's
    first heartbeat (through another broker) moves the attempt to RUNNING.
    The handle must still be recovered, and the run observed to its end."""
    from datetime import UTC, datetime

    from spotbroker.broker.recovery import agent_channel

    factory, settings, team = env
    marker = tmp_path / "runs.txt"
    job_id = submit(factory, team, run=f"echo $SPOTBROKER_ATTEMPT_ID >> {marker}; sleep 0.5")
    clock = ShiftedClock()
    with pytest.raises(Crash):
        reconciler(factory, settings, CrashingLauncher(settings.data_dir, after_launch=True), clock).pass_once()
    with transaction(factory) as s:
        (attempt,) = s.scalars(select(Attempt).where(Attempt.job_id == job_id)).all()
        agent_channel.record(s, attempt, [agent_channel.AgentEvent(1, "heartbeat", datetime.now(UTC), {})],
                             settings.checkpoint_uri)
    with factory() as s:
        assert s.get(Job, job_id).state == "RUNNING" and attempts(factory, job_id)[0].handle is None
    clock.shift = timedelta(seconds=settings.lease_seconds + 1)
    run_until(reconciler(factory, settings, clock=clock), factory, job_id, {"SUCCEEDED"})
    (attempt,) = attempts(factory, job_id)
    assert attempt.handle is not None and marker.read_text().split() == [str(attempt.id)]


def _deadline_job_running_on_spot(factory, settings, team, rec):
    from datetime import UTC, datetime

    job_id = submit(factory, team, run="sleep 60", resources={"accelerators": "T4:1"}, estimated_hours=1.0,
                    deadline=(datetime.now(UTC) + timedelta(hours=20)).isoformat())
    run_until(rec, factory, job_id, {"RUNNING"})
    (first,) = attempts(factory, job_id)
    assert first.use_spot
    # The deadline comes closer than the work left plus a restart (its owner moved it, say).
    with transaction(factory) as s:
        job = s.get(Job, job_id)
        job.spec = {**job.spec, "deadline": (datetime.now(UTC) + timedelta(minutes=50)).isoformat()}
        job.next_check_at = datetime.now(UTC)
    job = run_until(rec, factory, job_id, {"PREEMPTING"})
    assert job.reason.startswith("moving: deadline")
    return job_id, first


def test_any_word_of_a_running_attempts_agent_says_its_node_is_there(env):
    """An agent delivering a backlog of its trainer's events (thousands)
    holds its heartbeat behind them: the broker took the node for vanished
    and ran the job again, which wrote them again."""
    from datetime import UTC, datetime

    from spotbroker.broker.recovery import agent_channel

    factory, settings, team = env
    rec = reconciler(factory, settings, LocalLauncher(settings.data_dir, 1, agent=False))
    job_id = submit(factory, team, run="sleep 60")
    run_until(rec, factory, job_id, {"RUNNING"})
    (first,) = attempts(factory, job_id)
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    with transaction(factory) as s:
        attempt = s.get(Attempt, first.id)
        attempt.last_heartbeat_at = long_ago
        backlog = [agent_channel.AgentEvent(i, "resumed", datetime.now(UTC), {"step": i}) for i in range(1, 101)]
        assert agent_channel.record(s, attempt, backlog, settings.checkpoint_uri).accepted == 100
    with factory() as s:
        heard = s.get(Attempt, first.id).last_heartbeat_at
    assert heard.replace(tzinfo=UTC) > long_ago.replace(tzinfo=UTC) + timedelta(minutes=59), heard


def test_a_running_job_short_of_slack_is_drained_then_moved_to_on_demand(env):
    from datetime import UTC, datetime

    from spotbroker.broker.recovery import agent_channel

    factory, settings, team = env
    rec = reconciler(factory, settings, LocalLauncher(settings.data_dir, 1, agent=False))
    job_id, first = _deadline_job_running_on_spot(factory, settings, team, rec)
    event = agent_channel.AgentEvent
    with transaction(factory) as s:  # what the attempt's agent hears and says
        attempt = s.get(Attempt, first.id)
        root = settings.checkpoint_uri
        assert agent_channel.record(s, attempt, [event(1, "heartbeat", datetime.now(UTC), {})], root).drain
        team_name = s.get(Team, s.get(Job, job_id).team_id).name
        uri = checkpoint_uri(attempt_prefix(root, team_name, job_id, attempt.id), 7)
        outcome = agent_channel.record(s, attempt, [event(2, "checkpoint_committed", datetime.now(UTC),
                                                          {"step": 7, "uri": uri, "reason": "drain"})], root)
        assert not outcome.refused
    job = run_until(rec, factory, job_id, {"LAUNCHING", "RUNNING"})
    moved, second = attempts(factory, job_id)
    assert (moved.state, moved.reason) == ("PREEMPTED", "moved") and job.recoveries == 0
    assert not second.use_spot  # on-demand keeps the deadline
    _cancel(factory, rec, job_id)


def test_a_move_whose_agent_never_flushes_goes_on_after_the_drain_timeout(env):
    factory, settings, team = env
    clock = ShiftedClock()
    rec = reconciler(factory, settings, LocalLauncher(settings.data_dir, 1, agent=False), clock)
    job_id, first = _deadline_job_running_on_spot(factory, settings, team, rec)
    rec.pass_once()
    with factory() as s:
        assert s.get(Job, job_id).state == "PREEMPTING"
    clock.shift = timedelta(seconds=settings.drain_timeout + 1)
    run_until(rec, factory, job_id, {"LAUNCHING", "RUNNING"})
    moved = attempts(factory, job_id)[0]
    assert (moved.state, moved.reason) == ("PREEMPTED", "moved")
    with factory() as s:
        reasons = [e.data.get("reason") for e in s.scalars(select(Event).where(Event.job_id == job_id))]
    assert "moved: no flush came in time" in reasons
    _cancel(factory, rec, job_id)


def _cancel(factory, rec, job_id):
    # As the API cancels: an agent's heartbeat may write the attempt meanwhile.
    retrying(factory, lambda s: jobs.cancel(s, s.get(Job, job_id).team_id, job_id))
    rec.pass_once()  # the release phase stops what still runs


def test_a_job_told_to_wait_says_why_once_and_is_looked_at_again_each_interval(env):
    from spotbroker.broker.placement.placer import Choice
    from spotbroker.broker.placement.policy import Action

    factory, settings, team = env
    clock = ShiftedClock()
    rec = reconciler(factory, settings, clock=clock)
    rec.placer.choose = lambda *a, **k: Choice(Action.WAIT, (), "plan: wait")  # what the policy said
    job_id = submit(factory, team, run="true", resources={"accelerators": "T4:1"})
    for i in range(3):
        clock.shift = timedelta(seconds=i * (settings.placement_interval + 1))
        rec.pass_once()
    with factory() as s:
        job = s.get(Job, job_id)
        waits = s.scalars(select(Event).where(Event.job_id == job_id, Event.type == "waiting")).all()
        assert (job.state, job.reason) == ("PENDING", "waiting for spot: plan: wait") and len(waits) == 1
        assert job.next_check_at > clock.now() + timedelta(seconds=settings.placement_interval - 5)


class BrokenLauncher(LocalLauncher):
    """A launcher whose launch fails with what no retry cures (a bug, a bad value)."""

    def launch(self, request):
        raise ValueError("embedded null byte")


def test_any_launcher_exception_ends_the_attempt_and_frees_its_slot(env):
    factory, settings, team_id = env
    settings.local_max_running = 1
    broken = submit(factory, team_id, run="true")
    rec = reconciler(factory, settings, BrokenLauncher(settings.data_dir, 1))
    job = run_until(rec, factory, broken, {"FAILED"})
    assert "ValueError: embedded null byte" in job.reason
    [attempt] = attempts(factory, broken)
    assert (attempt.state, attempt.reason) == ("FAILED", "launch_error")
    fine = submit(factory, team_id, run="true")  # the one local slot is free again
    assert run_until(reconciler(factory, settings), factory, fine, {"SUCCEEDED"}).state == "SUCCEEDED"


def test_a_job_no_launcher_can_run_is_held_saying_what_to_enable_then_released(env):
    factory, settings, team_id = env
    gpu = submit(factory, team_id, run="true", resources={"accelerators": "T4:1"})
    cpu = submit(factory, team_id, run="true")
    settings.placement_interval = 0.05
    bare = Reconciler(factory, {}, settings, clock=Clock())  # a server off loopback: no local launcher
    for job_id in (gpu, cpu):
        job = run_until(bare, factory, job_id, {"HELD"})
        assert "SPOTBROKER_LOCAL_LAUNCHER=true" in job.reason
    for _ in range(3):
        bare.pass_once()  # it stays held, looked at again each interval, without errors
    with factory() as s:
        assert {s.get(Job, gpu).state, s.get(Job, cpu).state} == {"HELD"}
    time.sleep(0.1)
    rec = reconciler(factory, settings)  # a broker with the launcher on
    for job_id in (gpu, cpu):
        assert run_until(rec, factory, job_id, {"SUCCEEDED"}).state == "SUCCEEDED"


def test_a_missing_job_user_fails_the_job_saying_how_to_make_it(env):
    factory, settings, team_id = env
    job_id = submit(factory, team_id, run="true")
    rec = reconciler(factory, settings, LocalLauncher(settings.data_dir, 1, run_as="no-such-user-7d1"))
    job = run_until(rec, factory, job_id, {"FAILED"})
    assert "'no-such-user-7d1', which does not exist" in job.reason and "useradd" in job.reason


def test_a_broker_whose_database_failed_hears_its_agents_for_a_whole_timeout_before_it_judges_them(env):
    """Passes that failed (the database down, or its pool taken by one team's
    flood) mean the agents' heartbeats failed too: the first good pass after
    them took every node whose last beat was older than the timeout for lost,
    and restarted its job. A failed pass counts as a restart."""
    import threading

    from sqlalchemy.exc import OperationalError
    from support.helpers import wait_for

    factory, settings, team = env
    job_id = submit(factory, team, run="sleep 60")
    clock = ShiftedClock()
    rec = reconciler(factory, settings, clock=clock)
    run_until(rec, factory, job_id, {"RUNNING"})
    with transaction(factory) as s:  # the agent's last word before the database went away
        s.scalars(select(Attempt).where(Attempt.job_id == job_id)).one().last_heartbeat_at = Clock().now()
    clock.shift = timedelta(seconds=10 * settings.heartbeat_timeout)  # the outage: every heartbeat is old
    passes, read = [], rec._attempts_with_runs

    def database_back_after_one_pass():
        passes.append(1)
        if len(passes) == 1:
            raise OperationalError("SELECT 1", {}, Exception("could not connect to server"))
        return read()

    rec._attempts_with_runs = database_back_after_one_pass
    stop = threading.Event()
    loop = threading.Thread(target=rec.run_forever, args=(stop,), daemon=True)
    loop.start()
    wait_for(lambda: len(passes) >= 3, what="a failed pass, then good ones")
    stop.set()
    rec.hint()
    loop.join(120)  # a pass under way ends first: a loaded machine's took over 10 s, and the cancel's pass raced it
    assert not loop.is_alive(), "the reconciler's loop did not stop"
    found = attempts(factory, job_id)
    assert [a.state for a in found] == ["RUNNING"], [(a.state, a.reason) for a in found]  # not "vanished"
    _cancel(factory, rec, job_id)


def test_a_broker_that_was_down_hears_its_agents_for_a_whole_timeout_before_it_judges_them(env):
    """No agent could reach a broker that was down: the node of a job whose
    agent last spoke before the outage is not lost yet (it may be delivering
    its last events), until the restarted broker itself heard nothing for a
    heartbeat timeout."""
    factory, settings, team = env
    job_id = submit(factory, team, run="sleep 60")
    run_until(reconciler(factory, settings), factory, job_id, {"RUNNING"})
    with transaction(factory) as s:  # the agent's last word before the broker went down
        s.scalars(select(Attempt).where(Attempt.job_id == job_id)).one().last_heartbeat_at = Clock().now()
    clock = ShiftedClock()
    clock.shift = timedelta(seconds=10 * settings.heartbeat_timeout)  # the outage: every heartbeat is old
    restarted = reconciler(factory, settings, clock=clock)
    restarted.pass_once()
    [attempt] = attempts(factory, job_id)
    assert attempt.state == "RUNNING"
    clock.shift += timedelta(seconds=settings.heartbeat_timeout + 1)  # a timeout of its own, still silent
    job = run_until(restarted, factory, job_id, {"RECOVERING", "LAUNCHING", "RUNNING"} - {"RUNNING"})
    assert attempts(factory, job_id)[0].reason == "vanished", job.state
    _cancel(factory, restarted, job_id)
