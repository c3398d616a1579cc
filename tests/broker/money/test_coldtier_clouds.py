"""The cold tier on GCS and Azure, as on S3 (test_storage.py): old committed
checkpoints move to GCS's ARCHIVE class (objects.rewrite, against a fake of
the JSON API that checks each call) and to Azure's Archive tier (Set Blob
Tier, against Azurite), except `keep` ones; a resume from one is moved back
first (GCS, read at once) or held while it is rehydrated (Azure), and no
launch is ever handed it cold."""
from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select
from support.world import T0

from spotbroker.agent import protocol
from spotbroker.agent.checkpoint.coldtier import cold_tier
from spotbroker.agent.checkpoint.storage import Storage
from spotbroker.broker.checkpoints import coldtier as storage
from spotbroker.broker.launch.base import LaunchError
from spotbroker.broker.launch.request import launch_request
from spotbroker.broker.money.settings import MoneySettings
from spotbroker.broker.settings import Settings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Checkpoint
from spotbroker.broker.store.moneymodels import CheckpointTier

DAY = timedelta(days=1)
PART = b"w" * 4096
BIG = b"b" * (2 * 1024 * 1024 + 5)   # rewritten in three calls by the fake, as GCS does large objects
MANIFEST = b'{"format": "x", "objects": {}}'


def row(factory, uri, job_id, attempt_id, step, committed_at, keep=False) -> int:
    with transaction(factory) as s:
        r = Checkpoint(job_id=job_id, attempt_id=attempt_id, step=step, uri=uri, bytes=len(PART), keep=keep,
                       reason="periodic", committed_at=committed_at)
        s.add(r)
        s.flush()
        return r.id


def settings() -> MoneySettings:
    return MoneySettings(_env_file=None)


# --- GCS ---------------------------------------------------------------------------------------


def gcs_checkpoint(fake, gs_uri, factory, job, attempt, step, committed_at, keep=False) -> tuple[str, str]:
    bucket = gs_uri.removeprefix("gs://")
    prefix = f"ml/{job}/{attempt}/{protocol.step_dir(step)}"
    for name, data in (("part-00000.bin", PART), ("part-00001.bin", BIG), ("part-00002.bin", PART),
                       (protocol.MANIFEST, MANIFEST)):
        fake.put(bucket, f"{prefix}/{name}", data)
    row(factory, f"{gs_uri}/{prefix}", job, attempt, step, committed_at, keep)
    return bucket, prefix


def test_gcs_old_checkpoints_are_rewritten_to_archive_and_back_before_a_resume(
        factory, world, clock, gcs_fake, gs_uri, tmp_path):
    team = world.team()
    job = world.job(team, state="RECOVERING")
    first = world.attempt(job, start=T0 - 200 * DAY, end=T0 - 100 * DAY, end_reason="preempted")
    bucket, old = gcs_checkpoint(gcs_fake, gs_uri, factory, job, first, 7, T0 - 100 * DAY)
    _, gold = gcs_checkpoint(gcs_fake, gs_uri, factory, job, first, 3, T0 - 120 * DAY, keep=True)

    stats = storage.archive_due(factory, settings(), clock.now())
    assert (stats.archived, stats.objects, stats.failed) == (1, 3, 0)
    for name in ("part-00000.bin", "part-00001.bin", "part-00002.bin"):
        assert gcs_fake.storage_class(bucket, f"{old}/{name}") == "ARCHIVE"
        assert gcs_fake.storage_class(bucket, f"{gold}/{name}") == "STANDARD"      # keep
    assert gcs_fake.storage_class(bucket, f"{old}/{protocol.MANIFEST}") == "STANDARD"
    # What was asked of the API: a rewrite onto the same object with the class
    # in the body, the big object carried on with its rewrite token.
    rewrites = [(path, body) for method, path, body in gcs_fake.requests if "/rewriteTo/" in path]
    assert all(body == {"storageClass": "ARCHIVE"} for _, body in rewrites)
    assert len(rewrites) == 2 + 3 and sum("rewriteToken=" in p for p, _ in rewrites) == 2
    assert all("%2F" in p.split("/rewriteTo/")[0] for p, _ in rewrites)                 # the name is one segment
    with factory() as s:
        (tier,) = s.scalars(select(CheckpointTier)).all()
        summary = storage.storage_summary(s, team, settings())
    assert tier.storage_class == "ARCHIVE"
    assert summary.monthly_cost_by_class["ARCHIVE"] == pytest.approx(len(PART) / 2**30 * 0.0012)

    second = world.attempt(job, start=T0)
    broker = Settings(data_dir=tmp_path, checkpoint_uri=gs_uri, _env_file=None)
    with transaction(factory) as s:   # a launch never gets a cold RESUME_FROM
        with pytest.raises(LaunchError, match=r"step 7\) is in the cold tier \(ARCHIVE"):
            launch_request(s, s.get(Attempt, second), broker, b"key")
    with transaction(factory) as s:   # Archive is read at once: moved back at the first look, no hold
        assert storage.resume_hold(s, s.get(Attempt, second).job, clock.now(), settings()) is None
    for name in ("part-00000.bin", "part-00001.bin", "part-00002.bin"):
        assert gcs_fake.storage_class(bucket, f"{old}/{name}") == "STANDARD"
    with transaction(factory) as s:
        request = launch_request(s, s.get(Attempt, second), broker, b"key")
        assert s.scalars(select(CheckpointTier)).all() == []
    assert request.extra_env[protocol.ENV_RESUME_FROM] == f"{gs_uri}/{old}"


def test_gcs_a_refusing_api_archives_nothing_and_says_so(factory, world, clock, gcs_fake, gs_uri):
    team = world.team()
    job = world.job(team, state="SUCCEEDED")
    attempt = world.attempt(job, start=T0 - 200 * DAY, end=T0 - 100 * DAY)
    gcs_checkpoint(gcs_fake, gs_uri, factory, job, attempt, 1, T0 - 100 * DAY)
    gcs_fake.buckets.clear()                                   # the bucket is gone: every call is a 404
    stats = storage.archive_due(factory, settings(), clock.now())
    assert (stats.archived, stats.failed) == (0, 1)
    with factory() as s:
        assert s.scalars(select(CheckpointTier)).all() == []  # tried again on the next pass


# --- Azure -------------------------------------------------------------------------------------


def az_checkpoint(az_uri, factory, job, attempt, step, committed_at, keep=False) -> str:
    uri = f"{az_uri}/ml/{job}/{attempt}/{protocol.step_dir(step)}"
    store = Storage(uri)                      # through the storage layer (obstore), as an agent writes it
    store.put("part-00000.bin", PART)
    store.put(protocol.MANIFEST, MANIFEST)
    row(factory, uri, job, attempt, step, committed_at, keep)
    return uri


def test_azure_old_checkpoints_go_to_the_archive_tier_and_a_resume_waits_for_rehydration(
        factory, world, clock, az_uri, tmp_path):
    team = world.team()
    job = world.job(team, state="RECOVERING")
    first = world.attempt(job, start=T0 - 200 * DAY, end=T0 - 100 * DAY, end_reason="preempted")
    old = az_checkpoint(az_uri, factory, job, first, 7, T0 - 100 * DAY)
    gold = az_checkpoint(az_uri, factory, job, first, 3, T0 - 120 * DAY, keep=True)
    recent = az_checkpoint(az_uri, factory, job, first, 1, T0 - 10 * DAY)

    stats = storage.archive_due(factory, settings(), clock.now())
    assert (stats.archived, stats.objects, stats.failed) == (1, 1, 0)
    assert cold_tier(old).tier("part-00000.bin").storage_class == "Archive"
    assert cold_tier(old).tier(protocol.MANIFEST).storage_class == "Hot"          # still readable
    for uri in (gold, recent):
        assert cold_tier(uri).tier("part-00000.bin").storage_class == "Hot"
    with pytest.raises(Exception, match="(?i)archived"):                          # 409 BlobArchived
        Storage(old).get("part-00000.bin")
    assert Storage(old).get(protocol.MANIFEST) == MANIFEST
    assert storage.archive_due(factory, settings(), clock.now()).archived == 0    # once

    second = world.attempt(job, start=T0)
    broker = Settings(data_dir=tmp_path, checkpoint_uri=az_uri, _env_file=None)
    with transaction(factory) as s:
        with pytest.raises(LaunchError, match=r"step 7\) is in the cold tier \(Archive"):
            launch_request(s, s.get(Attempt, second), broker, b"key")
    with transaction(factory) as s:   # held: a rehydration to Hot is asked for
        why = storage.resume_hold(s, s.get(Attempt, second).job, clock.now(), settings())
    assert "step 7" in why and "restore (Standard) was asked for" in why
    clock.advance(hours=5)            # Azurite rehydrates at once (Azure: up to 15 hours)
    with transaction(factory) as s:
        assert storage.resume_hold(s, s.get(Attempt, second).job, clock.now(), settings()) is None
    assert cold_tier(old).tier("part-00000.bin").storage_class == "Hot"
    assert Storage(old).get("part-00000.bin") == PART
    with transaction(factory) as s:
        request = launch_request(s, s.get(Attempt, second), broker, b"key")
    assert request.extra_env[protocol.ENV_RESUME_FROM] == old
