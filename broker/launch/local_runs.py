"""The run directories of ended local attempts, removed once kept long enough.

A local attempt's run directory (broker/launch/local.py) holds its nodes'
homes, workdirs, temporary files and raw output: gigabytes for a job that
writes a dataset to its home, and nothing removed them. What outlives the
node is elsewhere: its log in the database (broker/jobs/logs.py), its
checkpoints under the checkpoint root. So once the attempt is released (its
nodes stopped) and ended SPOTBROKER_LOCAL_RUN_RETENTION_SECONDS ago, its
directory goes. Each broker prunes its own disk; a directory whose attempt
the database does not know is left alone.
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


def prune(factory: sessionmaker[Session], data_dir: Path, now: datetime, keep_s: float) -> int:
    """Remove the run directories of local attempts released and ended more
    than `keep_s` ago; how many were removed."""
    runs = data_dir / "runs"
    try:
        found = {int(p.name): p for p in runs.iterdir() if p.name.isdigit() and p.is_dir() and not p.is_symlink()}
    except FileNotFoundError:
        return 0
    ids, removed = sorted(found), 0
    for i in range(0, len(ids), _BATCH):
        with factory() as session:
            done = session.scalars(select(Attempt.id).where(
                Attempt.id.in_(ids[i:i + _BATCH]), Attempt.launcher == "local", Attempt.released.is_(True),
                Attempt.ended_at < now - timedelta(seconds=keep_s))).all()
        for attempt_id in done:
            # rmtree does not follow links (it walks by file descriptor): a job's
            # link out of its node directory is removed, not what it points at.
            shutil.rmtree(found[attempt_id], onerror=_report)
            removed += 1
    if removed:
        log.info("local runs: removed the directories of %d ended attempts", removed)
    return removed


def _report(function, path, exc_info) -> None:
    log.warning("local runs: could not remove %s: %s", path, exc_info[1])
