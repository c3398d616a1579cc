"""SkyPilot launcher figure: one reconciler pass with 50 SkyPilot launches
in flight (goal: <= 200 ms; the pass never waits on SkyPilot).

The jobs and attempts are real rows (LAUNCHING, a SkyPilot handle each);
the launcher is the real SkyPilotLauncher whose follower last heard each
launch RUNNING. Its SDK is an object that raises on any use: a pass that
called SkyPilot would fail here, not be timed.

    python bench/skypilot_launch.py [--launches 50] [--db sqlite|postgresql|both]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _db import temporary_database

from spotbroker.broker import auth
from spotbroker.broker.jobs import service as jobs
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.launch.skypilot.follow import Seen
from spotbroker.broker.launch.skypilot.launcher import SkyPilotLauncher, cluster_name
from spotbroker.broker.pricing.offers import Placement, seed_from_catalog
from spotbroker.broker.reconciler import Reconciler
from spotbroker.broker.settings import Settings
from spotbroker.broker.store import migrate
from spotbroker.broker.store.db import make_engine, make_session_factory, transaction
from spotbroker.broker.store.models import Job

WHERE = Placement(cloud="aws", region="us-east-1", zone="us-east-1b", zone_id="use1-az1", instance_type="g4dn.xlarge",
                  accelerator="T4", accelerator_count=1, use_spot=True, price_per_hour=0.2)


class NoSdk:
    def __getattr__(self, name):
        raise AssertionError(f"the reconciler's pass called SkyPilot (sky.{name})")


def bench(kind: str, launches: int, passes: int) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="spotbroker-bench-"))
    url, drop = temporary_database(kind, data_dir)
    engine = make_engine(url)
    try:
        migrate.upgrade(engine)
        factory = make_session_factory(engine)
        settings = Settings(database_url=url, data_dir=data_dir, launcher="skypilot", _env_file=None)
        launcher = SkyPilotLauncher(data_dir, prefix="bench", poll_s=3600, sky=NoSdk())
        rec = Reconciler(factory, {"skypilot": launcher}, settings)
        with transaction(factory) as s:
            seed_from_catalog(s)
            team, _ = auth.create_team(s, "bench")
            ids = [jobs.submit(s, team.id, JobSpec(run="python train.py")).id for _ in range(launches)]
        for job_id in ids:
            with transaction(factory) as s:
                job = s.get(Job, job_id)
                attempt = rec._new_attempt(s, job, JobSpec.model_validate(job.spec), WHERE, "skypilot", "bench")
                attempt.handle = {"cluster": cluster_name("bench", attempt.id), "request_id": f"r{attempt.id}",
                                  "submitted_at": time.time()}
                job.next_check_at = None
                # what the follower last heard: the launch request still running
                launcher.follower._seen[attempt.handle["cluster"]] = Seen(f"r{attempt.id}", "RUNNING")
        times = []
        for _ in range(passes):
            t = time.perf_counter()
            stats = rec.pass_once()
            times.append((time.perf_counter() - t) * 1000)
            assert stats.observed == launches and stats.stepped == 0, stats
        median = statistics.median(times)
        print(f"{kind}: one pass with {launches} SkyPilot launches in flight: median {median:.1f} ms, "
              f"max {max(times):.1f} ms over {passes} passes (goal <= 200 ms)")
    finally:
        engine.dispose()
        drop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=50)
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    args = ap.parse_args()
    for kind in (["sqlite", "postgresql"] if args.db == "both" else [args.db]):
        bench(kind, args.launches, args.passes)


if __name__ == "__main__":
    sys.exit(main())
