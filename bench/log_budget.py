"""A job's logs together, bounded (SPOTBROKER_MAX_JOB_LOG_BYTES): what it
costs the transaction that creates a new attempt (`logs.keep_within`, called
by `Launching.new_attempt`).

1. Nothing to remove: a job with --attempts ended attempts whose logs are
   within the bound (the common case, paid by every new attempt).
2. Removing: the oldest attempt's log of --mib MiB goes (a hostile job's
   restart: the bound of one log is 1 GiB by default).

Logs are written through the store's own append (`logs.append_at`).

    python bench/log_budget.py                  # PostgreSQL
    python bench/log_budget.py --db sqlite --mib 1024
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from _db import temporary_database

from spotbroker.broker import auth
from spotbroker.broker.jobs import logs
from spotbroker.broker.store import migrate
from spotbroker.broker.store.db import make_engine, make_session_factory, transaction
from spotbroker.broker.store.models import Attempt, Job

MIB = 1 << 20
NOW = datetime(2026, 11, 30, tzinfo=UTC)


def ended_attempts(factory, job_id: int, n: int) -> list[int]:
    with transaction(factory) as s:
        rows = [Attempt(job_id=job_id, state="FAILED", end_reason="failed", launcher="local", cloud="local",
                        region="local", instance_type="cpu", accelerator_count=0, use_spot=False, num_nodes=1,
                        price_per_hour=0.0, created_at=NOW, updated_at=NOW, ended_at=NOW, exit_code=1)
                for _ in range(n)]
        s.add_all(rows)
        s.flush()
        return [a.id for a in rows]


def fill(factory, attempt_id: int, size: int) -> None:
    piece = (b"y" * 1023 + b"\n") * 4096  # 4 MiB, as an agent ships it
    for offset in range(0, size, len(piece)):
        logs.append_at(factory, attempt_id, 0, offset, piece[:size - offset])


def timed(factory, job_id: int, limit: int) -> tuple[float, int]:
    t = time.perf_counter()
    with transaction(factory) as s:
        removed = logs.keep_within(s, job_id, limit, NOW)
    return time.perf_counter() - t, removed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--attempts", type=int, default=100, help="ended attempts of 1 MiB each, within the bound")
    parser.add_argument("--mib", type=int, default=256, help="the oldest attempt's log, removed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="spotbroker-bench-") as tmp:
        url, drop = temporary_database(args.db, Path(tmp))
        engine = make_engine(url)
        try:
            migrate.upgrade(engine)
            factory = make_session_factory(engine)
            with transaction(factory) as s:
                team, _ = auth.create_team(s, "bench")
                job = Job(team_id=team.id, name="loud", state="RUNNING", spec={"run": "true"}, restarts=0,
                          recoveries=0, created_at=NOW, updated_at=NOW)
                s.add(job)
                s.flush()
                job_id = job.id
            big = ended_attempts(factory, job_id, 1)[0]
            fill(factory, big, args.mib * MIB)
            for attempt_id in ended_attempts(factory, job_id, args.attempts):
                fill(factory, attempt_id, MIB)
            within = (args.mib + args.attempts) * MIB
            runs = [timed(factory, job_id, within)[0] * 1000 for _ in range(20)]
            print(f"{args.db}: nothing to remove ({args.attempts + 1} ended attempts, {args.mib + args.attempts} MiB):"
                  f" median {statistics.median(runs):.1f} ms, max {max(runs):.1f} ms")
            seconds, removed = timed(factory, job_id, args.attempts * MIB)
            assert removed == args.mib * MIB, removed
            print(f"{args.db}: removing the oldest attempt's {args.mib} MiB log: {seconds:.2f} s")
        finally:
            engine.dispose()
            drop()


if __name__ == "__main__":
    main()
