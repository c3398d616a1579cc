"""Time of the broker's placement decisions, database included.

A week of spot history (5,000 attempts by default, spread over the T4
places of the bundled catalog: some reclaimed, some refused, some running),
then `Placer.choose` for 200 PENDING T4 jobs, half of them with a deadline:
the reconciler's path (feasible offers, histories, the job's progress and
checkpoints, the policy). Printed: the once-per-pass history load, and one
job's decision (median, p99). The policy alone is measured by
bench/spot_cost.py (goal <= 1 ms for 20 zones).

With `--kubernetes N`, N Kubernetes places with T4 nodes are configured
too (broker/placement/kubernetes.py): each decision then also counts what
is held on them and merges them in.

With `--submitted-within H` the jobs were submitted at random times over
the last H hours (default 0: all now): each place's history is then read
as of each job's own start (`policy/fading.py`), not once for all.

With `--carbon-price P` every job sets `carbon_price_per_tonne: P`: each
decision then weighs emissions and is made a second time on dollars alone
(broker/placement/carbon.py).

    python bench/placement_decision.py [--attempts 5000] [--jobs 200] [--db sqlite|postgresql|both]
                                       [--kubernetes N] [--carbon-price P] [--submitted-within H]
"""
from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from _db import temporary_database
from sqlalchemy import insert

from spotbroker.broker import auth
from spotbroker.broker.clock import Clock
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.placement.placer import Placer, load_histories
from spotbroker.broker.pricing.offers import rank_offers, seed_from_catalog
from spotbroker.broker.settings import Settings
from spotbroker.broker.store import migrate
from spotbroker.broker.store.db import make_engine, make_session_factory, transaction
from spotbroker.broker.store.models import Attempt, Job
from spotbroker.broker.usecases import jobs

T4 = {"accelerators": "T4:1"}


def history(session, job_id: int, n: int, rng: random.Random) -> None:
    """`n` spot attempts over the last week on the T4 places."""
    places = rank_offers(session, JobSpec.model_validate({"run": "x", "resources": T4}), limit=400)
    now = Clock().now()
    rows = []
    for _ in range(n):
        p = rng.choice(places)
        start = now - timedelta(seconds=rng.uniform(0, 7 * 86400))
        fate = rng.random()
        life = timedelta(seconds=rng.expovariate(1 / 7200))
        base = dict(job_id=job_id, launcher="local", cloud=p.cloud, region=p.region, zone=p.zone,
                    zone_id=p.zone_id, instance_type=p.instance_type, accelerator=p.accelerator,
                    accelerator_count=p.accelerator_count, use_spot=True, num_nodes=1,
                    price_per_hour=p.price_per_hour, created_at=start - timedelta(minutes=3),
                    updated_at=now, released=True, agent_seq=0, version=1)
        if fate < 0.2:
            rows.append({**base, "state": "FAILED", "reason": "no_capacity", "end_reason": "no_capacity",
                         "ended_at": start})
        elif fate < 0.6 and start + life < now:
            rows.append({**base, "state": "PREEMPTED", "reason": "preempted", "end_reason": "preempted",
                         "started_at": start,
                         "ended_at": start + life})
        elif start + life < now:
            rows.append({**base, "state": "SUCCEEDED", "reason": "exit 0", "end_reason": "succeeded",
                         "started_at": start,
                         "ended_at": start + life})
        else:
            rows.append({**base, "state": "RUNNING", "started_at": start, "released": False})
    for row in rows:  # one shape for the executemany
        row.setdefault("reason", None)
        row.setdefault("end_reason", None)
        row.setdefault("started_at", None)
        row.setdefault("ended_at", None)
    session.execute(insert(Attempt), rows)


def kubernetes_places(data_dir: Path, n: int) -> Path:
    """N clusters of 10 nodes with 4 T4 each, free of charge."""
    import json

    path = data_dir / "kubernetes.json"
    path.write_text(json.dumps({"clusters": [
        {"context": f"lab-{i}", "nodes": [{"accelerator": "T4", "gpus_per_node": 4, "count": 10}]}
        for i in range(n)]}))
    return path


def bench(kind: str, n_attempts: int, n_jobs: int, n_clusters: int = 0, carbon_price: float = 0.0,
          submitted_within_h: float = 0.0) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="spotbroker-bench-"))
    url, drop = temporary_database(kind, data_dir)
    engine = make_engine(url)
    try:
        migrate.upgrade(engine)
        factory = make_session_factory(engine)
        settings = Settings(database_url=url, data_dir=data_dir, _env_file=None)
        if n_clusters:
            settings.kubernetes_places = kubernetes_places(data_dir, n_clusters)
        now = Clock().now()
        with transaction(factory) as s:
            seed_from_catalog(s)
            team, _ = auth.create_team(s, "bench")
            other = jobs.submit(s, team.id, JobSpec.model_validate({"run": "x", "resources": T4}))
            history(s, other.id, n_attempts, random.Random(7))
            ids = []
            rng = random.Random(11)
            for i in range(n_jobs):
                fields = {"run": "x", "resources": T4}
                if carbon_price:
                    fields["carbon_price_per_tonne"] = carbon_price
                if i % 2:
                    fields |= {"estimated_hours": 10, "deadline": (now + timedelta(hours=16)).isoformat()}
                job = jobs.submit(s, team.id, JobSpec.model_validate(fields))
                job.created_at = now - timedelta(hours=rng.uniform(0, submitted_within_h))
                ids.append(job.id)
        loads = []
        for _ in range(5):
            with factory() as s:
                t = time.perf_counter()
                load_histories(s, now, settings)
                loads.append(time.perf_counter() - t)
        placer = Placer(settings)
        times, spot, k8s = [], 0, 0
        with factory() as s:
            placer.choose(s, s.get(Job, ids[0]), JobSpec.model_validate(s.get(Job, ids[0]).spec), now)  # warm
            for job_id in ids:
                job = s.get(Job, job_id)
                spec = JobSpec.model_validate(job.spec)
                t = time.perf_counter()
                choice = placer.choose(s, job, spec, now)
                times.append(time.perf_counter() - t)
                spot += bool(choice.placements) and choice.placements[0].use_spot
                k8s += bool(choice.placements) and choice.placements[0].cloud == "k8s"
        times.sort()
        print(f"{kind}: history of {n_attempts} attempts loaded in {statistics.median(loads) * 1e3:.1f} ms "
              f"(once per pass); one job's decision: median {statistics.median(times) * 1e3:.2f} ms, "
              f"p99 {times[int(0.99 * (len(times) - 1))] * 1e3:.2f} ms over {n_jobs} jobs "
              f"({spot} placed on spot, {k8s} first on one of {n_clusters} Kubernetes places)")
    finally:
        engine.dispose()
        drop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attempts", type=int, default=5000)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    ap.add_argument("--kubernetes", type=int, default=0, metavar="N", help="Kubernetes places configured")
    ap.add_argument("--carbon-price", type=float, default=0.0, metavar="P", help="every job's $ per tonne CO2e")
    ap.add_argument("--submitted-within", type=float, default=0.0, metavar="H",
                    help="jobs submitted at random over the last H hours")
    args = ap.parse_args()
    for kind in (["sqlite", "postgresql"] if args.db == "both" else [args.db]):
        bench(kind, args.attempts, args.jobs, args.kubernetes, args.carbon_price, args.submitted_within)


if __name__ == "__main__":
    main()
