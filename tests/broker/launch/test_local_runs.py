"""The local launcher's ended runs' directories are removed once kept long
enough (broker/launch/local_runs.py), and nothing else is."""
from __future__ import annotations

from datetime import timedelta

from support.world import T0, World

from spotbroker.broker.launch import local_runs
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt

DAY = 86400.0


def test_a_released_attempt_ended_longer_ago_than_kept_loses_its_directory_and_only_it(factory, tmp_path):
    world = World(factory)
    job = world.job(world.team())
    now = T0 + timedelta(days=3)
    old = world.attempt(job, end=T0, end_reason="preempted")             # ended 3 days ago, released
    stopping = world.attempt(job, end=T0, end_reason="preempted")        # ended as long ago, not yet released
    recent = world.attempt(job, end=now - timedelta(hours=1))            # released an hour ago
    live = world.attempt(job)                                            # runs
    with transaction(factory) as s:
        for attempt_id in (old, recent):
            s.get(Attempt, attempt_id).released = True
    runs = tmp_path / "runs"
    outside = tmp_path / "broker-file"
    outside.write_text("the broker's own")
    for attempt_id in (old, stopping, recent, live, 99_999):
        home = runs / str(attempt_id) / "node-0" / "home"
        home.mkdir(parents=True)
        (home / "dataset.bin").write_bytes(b"x" * 1000)
        (home / "link").symlink_to(outside)                               # a job's link out of its node
    (runs / "notes").mkdir()

    assert local_runs.prune(factory, tmp_path, now, DAY) == 1
    assert sorted(p.name for p in runs.iterdir()) == sorted([str(stopping), str(recent), str(live), "99999", "notes"])
    assert outside.read_text() == "the broker's own"                     # the link went, not its target
    assert local_runs.prune(factory, tmp_path, now + timedelta(days=1), DAY) == 1  # the recent one's turn
    assert not (runs / str(recent)).exists() and (runs / str(stopping)).exists()
    assert local_runs.prune(factory, tmp_path / "nowhere", now, DAY) == 0  # no run ever made here


def test_a_job_keeps_the_directories_of_its_newest_ended_attempts_only(factory, tmp_path):
    # A job that fails at once and restarts: each attempt a home and a raw output on this disk.
    world = World(factory)
    job = world.job(world.team())
    now = T0 + timedelta(minutes=30)
    ended = [world.attempt(job, end=T0 + timedelta(minutes=i)) for i in range(6)]
    other = world.attempt(world.job(world.team("other")), end=T0)  # another job's: its own count
    with transaction(factory) as s:
        for attempt_id in (*ended, other):
            s.get(Attempt, attempt_id).released = True
    for attempt_id in (*ended, other):
        (tmp_path / "runs" / str(attempt_id) / "node-0").mkdir(parents=True)

    assert local_runs.prune(factory, tmp_path, now, DAY) == 6 - local_runs.KEEP_PER_JOB
    left = sorted(int(p.name) for p in (tmp_path / "runs").iterdir())
    assert left == sorted([*ended[-local_runs.KEEP_PER_JOB:], other])  # (all six were kept a day)
