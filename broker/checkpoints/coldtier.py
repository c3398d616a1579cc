"""What checkpoints cost to keep, and the cold tier that makes old ones cheap.

- **Archive**: a committed checkpoint older than the retention
  (`SPOTBROKER_MONEY_CHECKPOINT_RETENTION_DAYS`, 90) moves to the cold tier
  of its cloud (S3: the class `SPOTBROKER_MONEY_COLD_STORAGE_CLASS`,
  GLACIER by default; GCS: ARCHIVE; Azure: the Archive tier; see
  agent/checkpoint/coldtier/), except one marked `keep` (the gold weights).
  Its data objects move; its MANIFEST.json stays in the standard class, so
  what it holds can still be read and verified. A row in
  `checkpoint_tiers` says it is cold, in which class. A checkpoint on a
  local disk stays where it is (counted as left).
- **Resume**: a job whose newest checkpoint is cold is not launched with it.
  Where the cold class must be restored before a read (S3 Glacier, Azure
  Archive), the reconciler holds the job (HELD, saying why) and a restore
  is asked for; once every object is readable it is moved back to the
  standard class, the row goes, and the job is placed as usual. GCS
  Archive is read at once: it is moved back at the first look, no hold. A
  launch request refuses a cold checkpoint outright (LaunchError), so no
  attempt is ever handed one as RESUME_FROM.
- **Summary**: `storage_summary(session, team_id)`: a team's checkpoint
  bytes by class and their monthly cost, for the dashboard.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Float, and_, cast, func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.agent.checkpoint.coldtier import cold_tier, data_keys
from spotbroker.broker.checkpoints.records import newest_checkpoint
from spotbroker.broker.checkpoints.settings import CheckpointSettings, get_checkpoint_settings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Checkpoint, Job, TeamPolicy
from spotbroker.broker.store.moneymodels import CheckpointTier

log = logging.getLogger("spotbroker.money")
BATCH = 200          # checkpoints archived per pass (the rest wait for the next)
GIB = 2**30          # S3 bills a GB-month of 2^30 bytes


@dataclass
class ArchiveStats:
    archived: int = 0
    objects: int = 0
    left: int = 0       # on a local disk: no cold tier
    failed: int = 0


def archive_due(factory: sessionmaker[Session], settings: CheckpointSettings, now: datetime) -> ArchiveStats:
    """Move committed checkpoints past the retention to the cold tier (the
    team policy's `checkpoint_retention_days` where it sets one, else the
    broker's)."""
    stats = ArchiveStats()
    with factory() as session:
        due = session.execute(
            select(Checkpoint.id, Checkpoint.uri, Job.team_id).join(Job, Job.id == Checkpoint.job_id)
            .outerjoin(CheckpointTier, CheckpointTier.checkpoint_id == Checkpoint.id)
            .where(_past_retention(session, settings, now), Checkpoint.keep.is_(False),
                   CheckpointTier.checkpoint_id.is_(None))
            .order_by(Checkpoint.id).limit(BATCH)).all()
    for checkpoint_id, uri, team_id in due:
        if not uri.startswith(("s3://", "s3a://", "gs://", "az://")):
            stats.left += 1
            continue
        try:
            cold = cold_tier(uri, settings.cold_storage_class)
            keys = data_keys(cold)
            for key in keys:
                cold.archive(key)
        except Exception as exc:  # storage down or refusing: the next pass tries again
            stats.failed += 1
            log.warning("checkpoint %d: not archived (%s)", checkpoint_id, type(exc).__name__)
            continue
        with transaction(factory) as session:
            session.add(CheckpointTier(checkpoint_id=checkpoint_id, team_id=team_id,
                                       storage_class=cold.cold_class, archived_at=now))
        stats.archived += 1
        stats.objects += len(keys)
    return stats


def _past_retention(session: Session, settings: CheckpointSettings, now: datetime):
    """Committed before its team's retention: one clause per team whose policy sets its own."""
    own = {team_id: days for team_id, doc in session.execute(select(TeamPolicy.team_id, TeamPolicy.document))
           if (days := (doc or {}).get("checkpoint_retention_days")) is not None}
    default = Checkpoint.committed_at < now - timedelta(days=settings.checkpoint_retention_days)
    if not own:
        return default
    return or_(and_(Job.team_id.not_in(list(own)), default),
               *(and_(Job.team_id == team_id, Checkpoint.committed_at < now - timedelta(days=float(days)))
                 for team_id, days in own.items()))


def cold_reason(session: Session, checkpoint: Checkpoint | None) -> str | None:
    """Why `checkpoint` cannot be resumed from now (None: it can)."""
    if checkpoint is None:
        return None
    tier = session.get(CheckpointTier, checkpoint.id)
    if tier is None:
        return None
    return (f"its newest checkpoint (step {checkpoint.step}) is in the cold tier ({tier.storage_class}, "
            f"archived {tier.archived_at:%Y-%m-%d}) and must be restored before a new attempt can resume from it")


def resume_hold(session: Session, job: Job, now: datetime, settings: CheckpointSettings | None = None) -> str | None:
    """The reconciler's question before it places a job: is its newest
    checkpoint cold? If so a restore is asked for (once), and the job is
    held until every object is readable; then they are copied back to the
    standard class and the job may launch (None)."""
    newest = newest_checkpoint(session, job.id)
    why = cold_reason(session, newest)
    if why is None:
        return None
    settings = settings or get_checkpoint_settings()
    tier = session.get(CheckpointTier, newest.id)
    try:
        cold = cold_tier(newest.uri)   # restore and warm: the cold class it is in does not matter
        keys = data_keys(cold)
        if cold.needs_restore and tier.restore_requested_at is None:
            for key in keys:
                cold.restore(key, days=settings.restore_days, speed=settings.restore_tier)
            tier.restore_requested_at = now
            return f"{why}: a restore ({settings.restore_tier}) was asked for; the job launches once it is done"
        if not all(cold.tier(key).readable for key in keys):
            return (f"{why}: the restore asked for at {tier.restore_requested_at:%Y-%m-%d %H:%M} UTC is not "
                    f"done yet ({tier.storage_class} takes hours)")
        for key in keys:
            cold.warm(key)
    except Exception as exc:  # storage down: hold, and ask again on the next look
        return f"{why}; its storage could not be reached to restore it ({type(exc).__name__})"
    session.delete(tier)
    session.flush()
    log.info("checkpoint %d restored from the cold tier for job %d", newest.id, job.id)
    return None


@dataclass
class StorageSummary:
    """A team's checkpoints: how many, their bytes by storage class, and what
    a month of keeping them costs at the configured prices."""

    checkpoints: int = 0
    bytes_by_class: dict[str, int] = field(default_factory=dict)
    monthly_cost_by_class: dict[str, float] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(self.bytes_by_class.values())

    @property
    def monthly_cost(self) -> float:
        return sum(self.monthly_cost_by_class.values())


def storage_summary(session: Session, team_id: int, settings: CheckpointSettings | None = None) -> StorageSummary:
    """A team's checkpoint storage and its monthly cost, from the database
    (the bytes each checkpoint's agent reported; cold ones by their class)."""
    settings = settings or get_checkpoint_settings()
    prices = {"STANDARD": settings.storage_price_standard, "GLACIER": settings.storage_price_glacier,
              "DEEP_ARCHIVE": settings.storage_price_deep_archive, "ARCHIVE": settings.storage_price_gcs_archive,
              "Archive": settings.storage_price_azure_archive}
    out = StorageSummary()
    for cold, count, size in session.execute(
            # summed as floats: SQLite's integer sum() raises past 2**63 (a job's own reports add up to it)
            select(CheckpointTier.storage_class, func.count(),
                   func.coalesce(func.sum(cast(Checkpoint.bytes, Float)), 0))
            .join(Job, Job.id == Checkpoint.job_id)
            .outerjoin(CheckpointTier, CheckpointTier.checkpoint_id == Checkpoint.id)
            .where(Job.team_id == team_id).group_by(CheckpointTier.storage_class)):
        cls = cold or "STANDARD"
        out.checkpoints += count
        out.bytes_by_class[cls] = int(size)
        out.monthly_cost_by_class[cls] = int(size) / GIB * prices.get(cls, settings.storage_price_standard)
    return out
