"""The run directories of ended local attempts, removed once kept long enough.

A local attempt's run directory (broker/launch/local.py) holds its nodes'
homes, workdirs, temporary files and raw output: gigabytes for a job that
writes a dataset to its home, and nothing removed them. What outlives the
node is elsewhere: its log in the database (broker/jobs/logs.py), its
checkpoints under the checkpoint root. So once the attempt is released (its
nodes stopped) and ended SPOTBROKER_LOCAL_RUN_RETENTION_SECONDS ago, its
directory goes; so does that of an ended attempt with KEEP_PER_JOB newer
ended ones of its job here, at the next sweep, whatever its age (a job that
fails at once and restarts a thousand times would keep a thousand homes and
raw outputs for the retention). Each broker prunes its own disk; a
directory whose attempt the database does not know is left alone.
"""
from __future__ import annotations

import logging
import shutil
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.store.models import Attempt

log = logging.getLogger(__name__)

_BATCH = 500  # attempt ids asked about in one query
KEEP_PER_JOB = 3  # a job's newest ended attempts whose directories wait out the retention


def prune(factory: sessionmaker[Session], data_dir: Path, now: datetime, keep_s: float) -> int:
    """Remove the run directories of local attempts released and ended more
    than `keep_s` ago, or behind KEEP_PER_JOB newer ones of their job; how
    many were removed."""
    runs = data_dir / "runs"
    try:
        found = {int(p.name): p for p in runs.iterdir() if p.name.isdigit() and p.is_dir() and not p.is_symlink()}
    except FileNotFoundError:
        return 0
    ids, ended = sorted(found), []
    for i in range(0, len(ids), _BATCH):
        with factory() as session:
            ended += session.execute(select(Attempt.id, Attempt.job_id, Attempt.ended_at).where(
                Attempt.id.in_(ids[i:i + _BATCH]), Attempt.launcher == "local", Attempt.released.is_(True),
                Attempt.ended_at.is_not(None))).all()
    newer: dict[int, int] = {}  # job id -> its ended attempts seen so far, newest first
    removed = 0
    for attempt_id, job_id, ended_at in sorted(ended, key=lambda row: -row.id):
        newer[job_id] = newer.get(job_id, 0) + 1
        if newer[job_id] > KEEP_PER_JOB or ended_at < now - timedelta(seconds=keep_s):
            # rmtree does not follow links (it walks by file descriptor): a job's
            # link out of its node directory is removed, not what it points at.
            shutil.rmtree(found[attempt_id], onerror=_report)
            removed += 1
    if removed:
        log.info("local runs: removed the directories of %d ended attempts", removed)
    return removed


def _report(function, path, exc_info) -> None:
    log.warning("local runs: could not remove %s: %s", path, exc_info[1])
