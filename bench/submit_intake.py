"""What a team's policy and budget add to a submission (`broker/usecases/intake.py`):
the milliseconds of the one session that reads the team (policy, budget
hold, its unfinished jobs counted against SPOTBROKER_MAX_UNFINISHED_JOBS_PER_TEAM)
before the spec, and of the limits' check for a team with a policy (its
cheapest place for `max_price_per_hour`, its GPUs running).

    python bench/submit_intake.py                 # PostgreSQL and SQLite
    python bench/submit_intake.py --db sqlite --n 500
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from _db import temporary_database
from sqlalchemy import insert

from spotbroker.broker import auth
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.pricing.offers import seed_from_catalog
from spotbroker.broker.store import migrate
from spotbroker.broker.store.db import make_engine, make_session_factory, transaction
from spotbroker.broker.store.models import Job
from spotbroker.broker.teampolicy import policy as policies
from spotbroker.broker.usecases import intake

SPEC = JobSpec.model_validate({"run": "python train.py", "resources": {"accelerators": "A100:1"}})
POLICY = policies.Policy(envs={"MIXED_PRECISION": "bf16"}, allowed_accelerators=["A100", "H100"], max_nodes=4,
                         max_gpus_running=64, max_price_per_hour=100.0)


def timed(fn, n: int) -> tuple[float, float]:
    """(p50, p99) milliseconds of n calls."""
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(0.99 * (len(samples) - 1))]


def _jobs(session, team_id: int, ended: int, unfinished: int) -> None:
    now = datetime.now(UTC)
    row = dict(team_id=team_id, name="j", reason="", spec={}, created_at=now, updated_at=now, next_check_at=now,
               restarts=0, recoveries=0, version=1)
    session.execute(insert(Job), [dict(row, state="SUCCEEDED") for _ in range(ended)]
                    + [dict(row, state="PENDING") for _ in range(unfinished)])


def run(kind: str, n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url, drop = temporary_database(kind, Path(tmp))
        engine = make_engine(url)
        try:
            migrate.upgrade(engine)
            factory = make_session_factory(engine)
            with transaction(factory) as s:
                seed_from_catalog(s)
                plain, _ = auth.create_team(s, "plain")
                ruled, _ = auth.create_team(s, "ruled")
                policies.put(s, ruled.id, POLICY)
                busy, _ = auth.create_team(s, "busy")
                _jobs(s, busy.id, ended=50_000, unfinished=900)
            now = datetime.now(UTC)
            rows = [("no policy: read the team", lambda: intake.team_of(factory, plain.id, now)),
                    ("read it, count its jobs", lambda: intake.team_of(factory, plain.id, now, 1000)),
                    ("900 of 50,900 unfinished", lambda: intake.team_of(factory, busy.id, now, 1000))]
            known = intake.team_of(factory, ruled.id, now)
            rows += [("a policy: read the team", lambda: intake.team_of(factory, ruled.id, now)),
                     ("a policy: check the limits", lambda: intake.admit(factory, ruled.id, "ruled", SPEC, known,
                                                                         False))]
            for what, fn in rows:
                timed(fn, 20)  # warm
                p50, p99 = timed(fn, n)
                print(f"{kind:<10} {what:<28} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  ({n} calls)")
        finally:
            engine.dispose()
            drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--n", type=int, default=300)
    args = parser.parse_args()
    for kind in ("postgresql", "sqlite") if args.db == "both" else (args.db,):
        run(kind, args.n)


if __name__ == "__main__":
    main()
