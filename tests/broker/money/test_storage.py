"""Checkpoint storage costs: old committed checkpoints move to S3 Glacier
(moto's server, real HTTP) except those marked `keep`; a resume from an
archived one is held while it is restored, and no launch is ever handed it;
a team's storage bytes and monthly cost by class."""
from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select
from support.money import PART, checkpoint, settings, storage_class
from support.s3fixtures import s3_client
from support.world import T0

from spotbroker.agent import protocol
from spotbroker.agent.checkpoint.storage import Storage
from spotbroker.broker.checkpoints import coldtier as storage
from spotbroker.broker.launch.base import LaunchError
from spotbroker.broker.launch.request import launch_request
from spotbroker.broker.settings import Settings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Checkpoint
from spotbroker.broker.store.moneymodels import CheckpointTier

DAY = timedelta(days=1)
def test_old_checkpoints_go_cold_except_kept_and_recent_ones(factory, world, clock, s3_uri, moto_endpoint):
    team = world.team()
    job = world.job(team, state="SUCCEEDED")
    attempt = world.attempt(job, start=T0 - 200 * DAY, end=T0 - 1 * DAY)
    _, old = checkpoint(factory, s3_uri, job, attempt, 1, T0 - 100 * DAY)
    _, gold = checkpoint(factory, s3_uri, job, attempt, 2, T0 - 95 * DAY, keep=True)
    _, recent = checkpoint(factory, s3_uri, job, attempt, 3, T0 - 10 * DAY)
    with transaction(factory) as s:   # a checkpoint on a local disk has no cold tier: left where it is
        s.add(Checkpoint(job_id=job, attempt_id=attempt, step=0, uri="file:///data/c/step-0", bytes=10, keep=False,
                         committed_at=T0 - 120 * DAY))

    stats = storage.archive_due(factory, settings(), clock.now())
    assert (stats.archived, stats.objects, stats.left, stats.failed) == (1, 1, 1, 0)
    assert storage_class(moto_endpoint, old, "part-00000.bin") == "GLACIER"
    assert storage_class(moto_endpoint, old, protocol.MANIFEST) == "STANDARD"   # still readable
    for uri in (gold, recent):
        assert storage_class(moto_endpoint, uri, "part-00000.bin") == "STANDARD"
    with pytest.raises(Exception, match="(?i)storage class|InvalidObjectState"):
        Storage(old).get("part-00000.bin")
    assert storage.archive_due(factory, settings(), clock.now()).archived == 0   # once

    with factory() as s:
        summary = storage.storage_summary(s, team, settings())
    assert summary.checkpoints == 4
    assert summary.bytes_by_class == {"STANDARD": 2 * 4096 + 10, "GLACIER": 4096}
    assert summary.monthly_cost == pytest.approx((2 * 4096 + 10) / 2**30 * 0.023 + 4096 / 2**30 * 0.0036)


def test_a_resume_from_a_cold_checkpoint_is_held_until_restored_and_never_handed_over_cold(
        factory, world, clock, s3_uri, moto_endpoint, tmp_path):
    team = world.team()
    job = world.job(team, state="RECOVERING")
    first = world.attempt(job, start=T0 - 200 * DAY, end=T0 - 100 * DAY, end_reason="preempted")
    checkpoint(factory, s3_uri, job, first, 1, T0 - 150 * DAY)
    _, newest = checkpoint(factory, s3_uri, job, first, 7, T0 - 100 * DAY)
    assert storage.archive_due(factory, settings(), clock.now()).archived == 2
    second = world.attempt(job, start=T0)
    broker = Settings(data_dir=tmp_path, checkpoint_uri=s3_uri, _env_file=None)

    with transaction(factory) as s:   # a launch never gets a cold RESUME_FROM
        with pytest.raises(LaunchError, match=r"step 7\) is in the cold tier \(GLACIER"):
            launch_request(s, s.get(Attempt, second), broker, b"key")
    with transaction(factory) as s:
        why = storage.resume_hold(s, s.get(Attempt, second).job, clock.now(), settings())
    assert "step 7" in why and "restore (Standard) was asked for" in why
    bucket, _, path = newest.removeprefix("s3://").partition("/")
    head = s3_client(moto_endpoint).head_object(Bucket=bucket, Key=f"{path}/part-00000.bin")
    assert "ongoing-request" in head["Restore"]     # asked of S3 (moto restores at once)
    clock.advance(hours=5)
    with transaction(factory) as s:   # restored: copied back to the standard class; it may launch
        assert storage.resume_hold(s, s.get(Attempt, second).job, clock.now(), settings()) is None
    assert storage_class(moto_endpoint, newest, "part-00000.bin") == "STANDARD"
    assert Storage(newest).get("part-00000.bin") == PART
    with transaction(factory) as s:
        request = launch_request(s, s.get(Attempt, second), broker, b"key")
        tiers = s.scalars(select(CheckpointTier.checkpoint_id)).all()
    assert request.extra_env[protocol.ENV_RESUME_FROM] == newest
    assert len(tiers) == 1    # the older one stays cold: nothing asked for it


def test_a_teams_storage_is_summed_past_what_sqlite_integers_hold(factory, world):
    """A job's agent reported checkpoints of 2**63-1 bytes (allowed then):
    SQLite's integer sum() raised 'integer overflow', and the team's dashboard
    page answered 503 "the database did not answer" to the team and the admin."""
    team = world.team()
    job = world.job(team, state="SUCCEEDED")
    attempt = world.attempt(job, start=T0 - 2 * DAY, end=T0 - 1 * DAY)
    with transaction(factory) as s:  # rows stored before reports were bounded (MAX_CHECKPOINT_BYTES)
        s.add_all(Checkpoint(job_id=job, attempt_id=attempt, step=i, uri=f"file:///data/c/step-{i}", bytes=2**63 - 1,
                             keep=False, committed_at=T0 - DAY) for i in range(3))
    with factory() as s:
        summary = storage.storage_summary(s, team, settings())
    assert summary.checkpoints == 3 and summary.bytes_by_class["STANDARD"] == pytest.approx(3 * (2**63 - 1))
