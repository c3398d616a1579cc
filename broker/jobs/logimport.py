"""The upgrade path of logs written before the log store (migration 0013):
`{data_dir}/logs/{job_id}/{attempt_id}[.node-{rank}].log` on the disk of the
broker that received them. At its start each broker moves those it holds
into the database, one file at a time and a batch of rows at a time (never
a whole log in memory), then removes the file. A log the store already has
(another replica imported it, or a crash came between the commit and the
removal) is only removed.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.jobs import logs
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, LogChunk

log = logging.getLogger(__name__)

_NAME = re.compile(r"(\d+)(?:\.node-(\d+))?\.log")
_BATCH_ROWS = 16  # rows inserted at once: 1 MiB held


def import_disk_logs(factory: sessionmaker[Session], data_dir: Path) -> int:
    """Move the logs under `data_dir/logs` into the store; how many were imported."""
    imported = 0
    for path in sorted((data_dir / "logs").glob("*/*.log")):
        named = _NAME.fullmatch(path.name)
        if named is None:
            continue
        attempt_id, rank = int(named.group(1)), int(named.group(2) or 0)
        try:
            imported += _import_one(factory, path, attempt_id, rank)
        except IntegrityError:  # another replica imports the same file (shared disk): its rows stand
            pass
        except OSError as exc:
            log.warning("attempt log %s: not imported into the log store (%s)", path, exc)
            continue
        path.unlink(missing_ok=True)
    if imported:
        log.info("imported %d attempt log(s) from %s into the database", imported, data_dir / "logs")
    return imported


def _import_one(factory: sessionmaker[Session], path: Path, attempt_id: int, rank: int) -> int:
    with transaction(factory) as session:
        if session.scalar(select(Attempt.id).where(Attempt.id == attempt_id)) is None:
            return 0  # its attempt is gone: nothing could read it
        if logs.size(session, attempt_id, rank):
            return 0
        start = 0
        with path.open("rb") as f:
            while True:
                rows = []
                for _ in range(_BATCH_ROWS):
                    data = f.read(logs.ROW_BYTES)
                    if not data:
                        break
                    rows.append({"attempt_id": attempt_id, "rank": rank, "start": start, "size": len(data),
                                 "data": data})
                    start += len(data)
                if not rows:
                    break
                session.execute(insert(LogChunk), rows)
    return 1
