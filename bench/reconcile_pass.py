"""Time of one reconciler pass with 1,000 jobs RUNNING (goal: <= 200 ms).

The jobs are real: 1,000 `sleep` processes started by the local launcher
through the reconciler itself (without a node agent each: a pass does not
talk to agents, and 1,000 of them would not fit in memory here). A pass then asks the launcher about every
attempt, releases nothing, claims nothing, and that is what is timed.

    python bench/reconcile_pass.py [--jobs 1000] [--db sqlite|postgresql|both]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _db import temporary_database
from sqlalchemy import func, select

from spotbroker.broker import auth
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.launch.local import LocalLauncher
from spotbroker.broker.pricing.offers import seed_from_catalog
from spotbroker.broker.reconciler import Reconciler
from spotbroker.broker.settings import Settings
from spotbroker.broker.store import migrate
from spotbroker.broker.store.db import make_engine, make_session_factory, transaction
from spotbroker.broker.store.models import Attempt, Job
from spotbroker.broker.usecases import jobs


def bench(kind: str, n_jobs: int, passes: int) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="spotbroker-bench-"))
    url, drop = temporary_database(kind, data_dir)
    engine = make_engine(url)
    launcher = None
    try:
        migrate.upgrade(engine)
        factory = make_session_factory(engine)
        settings = Settings(database_url=url, data_dir=data_dir, local_max_running=n_jobs, _env_file=None)
        with transaction(factory) as s:
            seed_from_catalog(s)
            team, _ = auth.create_team(s, "bench")
            for _ in range(n_jobs):
                jobs.submit(s, team.id, JobSpec(run="exec sleep 3600"))
        # Without node agents: 1,000 of them would not fit in this machine's
        # memory, and a pass never talks to them (they talk to the API).
        launcher = LocalLauncher(data_dir, 1, agent=False)
        rec = Reconciler(factory, {"local": launcher}, settings)
        t = time.perf_counter()
        while True:
            rec.pass_once()
            with factory() as s:
                running = s.scalar(select(func.count()).select_from(Job).where(Job.state == "RUNNING"))
            if running == n_jobs:
                break
        print(f"{kind}: {n_jobs} jobs launched and RUNNING in {time.perf_counter() - t:.1f} s")
        times = []
        for _ in range(passes):
            t = time.perf_counter()
            stats = rec.pass_once()
            times.append((time.perf_counter() - t) * 1000)
            assert stats.observed == n_jobs and stats.stepped == 0, stats
        print(f"{kind}: one pass over {n_jobs} RUNNING jobs: median {statistics.median(times):.1f} ms, "
              f"max {max(times):.1f} ms over {passes} passes (goal <= 200 ms)")
    finally:
        with make_session_factory(engine)() as s:
            handles = [a.handle for a in s.scalars(select(Attempt)) if a.handle]
        for h in handles:
            (launcher or LocalLauncher(data_dir, 1)).terminate(h)
        engine.dispose()
        drop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    args = ap.parse_args()
    for kind in (["sqlite", "postgresql"] if args.db == "both" else [args.db]):
        bench(kind, args.jobs, args.passes)


if __name__ == "__main__":
    sys.exit(main())
