"""A team policy's `checkpoint_retention_days` decides when that team's
checkpoints move to the cold tier (moto's S3 server); other teams keep the
broker's retention."""
from __future__ import annotations

from datetime import timedelta

from support.money import checkpoint, settings, storage_class
from support.world import T0

from spotbroker.broker.checkpoints import coldtier as storage
from spotbroker.broker.store.db import transaction
from spotbroker.broker.teampolicy import policy as policies

DAY = timedelta(days=1)


def test_a_teams_retention_days_move_its_checkpoints_cold_sooner(factory, world, clock, s3_uri, moto_endpoint):
    short, usual = world.team("short"), world.team("usual")
    with transaction(factory) as s:
        policies.put(s, short, policies.Policy(checkpoint_retention_days=7))
    uris = {}
    for team in (short, usual):
        job = world.job(team, state="SUCCEEDED")
        attempt = world.attempt(job, start=T0 - 20 * DAY, end=T0 - 9 * DAY)
        _, uris[team] = checkpoint(factory, s3_uri, job, attempt, 1, T0 - 10 * DAY)
        _, uris[-team] = checkpoint(factory, s3_uri, job, attempt, 2, T0 - 3 * DAY)
    assert settings().checkpoint_retention_days > 10
    stats = storage.archive_due(factory, settings(), clock.now())
    assert (stats.archived, stats.failed) == (1, 0)
    assert storage_class(moto_endpoint, uris[short], "part-00000.bin") == "GLACIER"    # past its team's 7 days
    for uri in (uris[usual], uris[-short], uris[-usual]):
        assert storage_class(moto_endpoint, uri, "part-00000.bin") == "STANDARD"
