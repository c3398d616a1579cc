"""SkyPilot launcher figures (the issue's goals in brackets):

1. one reconciler pass with 50 SkyPilot launches in flight [<= 200 ms; the
   pass never waits on SkyPilot]. The jobs and attempts are real rows
   (LAUNCHING, a SkyPilot handle each); the launcher is the real
   SkyPilotLauncher whose follower last heard each launch RUNNING. Its SDK
   is an object that raises on any use: a pass that called SkyPilot would
   fail here, not be timed.
2. capacity error seen -> the next place's launch request [<= 1 s]: the
   real reconciler loop (`run_forever`), the real launcher and follower,
   against a scripted SDK (`ScriptedSky`) whose first launch of each job
   ends in `ResourcesUnavailableError`. Timed from the reconciler's
   `status` call that returns the refusal to the next `sky.launch` call
   (the node's Task built by the real launcher, SkyPilot imported, in between).
3. broker crash -> the orphan's `sky.down` request [<= one janitor
   interval]: the real janitor loop over a real database, the scripted SDK
   listing a cluster whose attempt was cancelled while its broker was down.
   Timed from the janitor's start (the broker's restart) and, for an orphan
   left while the janitor runs, from the moment the orphan appears.

    python bench/skypilot_launch.py [--launches 50] [--db sqlite|postgresql|both] [--only pass|capacity|janitor]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from _db import temporary_database

from spotbroker.broker import auth
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.launch.skypilot.follow import Seen
from spotbroker.broker.launch.skypilot.launcher import SkyPilotLauncher, cluster_name
from spotbroker.broker.pricing.offers import Placement, seed_from_catalog
from spotbroker.broker.reconciler import Reconciler
from spotbroker.broker.settings import Settings
from spotbroker.broker.store import migrate
from spotbroker.broker.store.db import make_engine, make_session_factory, transaction
from spotbroker.broker.store.models import Job
from spotbroker.broker.usecases import jobs

WHERE = Placement(cloud="aws", region="us-east-1", zone="us-east-1b", zone_id="use1-az1", instance_type="g4dn.xlarge",
                  accelerator="T4", accelerator_count=1, use_spot=True, price_per_hour=0.2)


class NoSdk:
    def __getattr__(self, name):
        raise AssertionError(f"the reconciler's pass called SkyPilot (sky.{name})")


def bench_pass(kind: str, launches: int, passes: int) -> None:
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
                attempt = rec.launching.new_attempt(s, job, JobSpec.model_validate(job.spec), WHERE, "skypilot",
                                                    "bench")
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


class ResourcesUnavailableError(Exception):
    """What SkyPilot raises for a refusal (the launcher reads the class name)."""

    failover_history: list = []


class ScriptedSky:
    """SkyPilot's SDK as the launcher and janitor use it: launches are
    recorded with the time of the call; the first launch of each job (by
    `refuse`) fails for capacity once the follower asks about it."""

    def __init__(self) -> None:
        import sky  # the launcher builds real Resources with it: SkyPilot's own code is timed

        self.Resources = sky.Resources
        self.lock = threading.Lock()
        self.launched: list[tuple[float, str]] = []
        self.downed: dict[str, float] = {}
        self.refused: set[str] = set()
        self.clusters: list[str] = []

    def launch(self, task, cluster_name: str, **_):
        with self.lock:
            self.launched.append((time.perf_counter(), cluster_name))
        return f"r-{cluster_name}"

    def api_status(self, request_ids=None, cluster_name=None, **_):
        if request_ids is None:
            return []  # no earlier launch to re-attach to; nothing in flight for the janitor
        return [SimpleNamespace(request_id=r, status="FAILED" if r[2:] in self.refused else "RUNNING")
                for r in request_ids]

    def get(self, request_id):
        if isinstance(request_id, tuple):  # status(), check() and enabled_clouds() below answer directly
            return request_id[1]
        raise ResourcesUnavailableError("Failed to acquire resources in us-east-1b: InsufficientInstanceCapacity")

    def status(self, cluster_names=None, **_):
        return ("status", [{"name": n, "status": "INIT"} for n in self.clusters])

    def enabled_clouds(self, expand=False):
        return ("enabled_clouds", ["aws"])

    def check(self, infra_list, verbose):
        return ("check", {})

    def api_cancel(self, request_id, silent=True):
        return None

    def down(self, name: str):
        with self.lock:
            self.downed.setdefault(name, time.perf_counter())
        return f"down-{name}"


def _offline_sky() -> None:
    """SkyPilot's own code (the Task the launcher builds) runs offline: a
    home of its own (the catalog files the broker places) and no API server."""
    os.environ["HOME"] = tempfile.mkdtemp(prefix="spotbroker-bench-home-")
    os.environ["SKYPILOT_DISABLE_LOCAL_API_SERVER"] = "1"
    os.environ["SKYPILOT_DISABLE_USAGE_COLLECTION"] = "1"


def _fresh(kind: str):
    data_dir = Path(tempfile.mkdtemp(prefix="spotbroker-bench-"))
    url, drop = temporary_database(kind, data_dir)
    engine = make_engine(url)
    migrate.upgrade(engine)
    settings = Settings(database_url=url, data_dir=data_dir, launcher="skypilot", _env_file=None)
    return data_dir, engine, make_session_factory(engine), settings, drop


def bench_capacity(kind: str, trials: int) -> None:
    """Figure 2: see the module's docstring."""
    _offline_sky()
    data_dir, engine, factory, settings, drop = _fresh(kind)
    sky = ScriptedSky()
    launcher = SkyPilotLauncher(data_dir, prefix="bench", poll_s=0.2, sky=sky)
    launcher.task(_warm_request())  # SkyPilot's import and catalog read: once per broker, not per refusal
    rec = Reconciler(factory, {"skypilot": launcher}, settings)
    launcher.set_on_change(rec.hint)
    seen: dict[str, float] = {}
    status = launcher.status

    def timed_status(handle):
        out = status(handle)
        if out.capacity:
            seen.setdefault(handle["cluster"], time.perf_counter())
        return out

    launcher.status = timed_status
    stop = threading.Event()
    loop = threading.Thread(target=rec.run_forever, args=(stop,), daemon=True)
    loop.start()
    lags = []
    try:
        with transaction(factory) as s:
            seed_from_catalog(s)
            team, _ = auth.create_team(s, "bench")
        for _ in range(trials):
            before = len(sky.launched)
            with transaction(factory) as s:
                jobs.submit(s, team.id, JobSpec.model_validate(
                    {"run": "python train.py", "resources": {"accelerators": "T4:1", "disk_size": 200}}))
            rec.hint()
            first = _wait(lambda n=before: len(sky.launched) > n and sky.launched[n], 30)
            sky.refused.add(first[1])
            second = _wait(lambda n=before + 1: len(sky.launched) > n and sky.launched[n], 30)
            lags.append((second[0] - seen[first[1]]) * 1000)
    finally:
        stop.set()
        loop.join(timeout=10)
        launcher.close()
        engine.dispose()
        drop()
    print(f"{kind}: capacity error seen -> next place's launch request: median {statistics.median(lags):.0f} ms, "
          f"max {max(lags):.0f} ms over {trials} refusals (goal <= 1000 ms)")


def _warm_request():
    from spotbroker.broker.launch.base import LaunchRequest

    spec = JobSpec.model_validate({"run": "true", "resources": {"accelerators": "T4:1"}})
    return LaunchRequest(attempt_id=0, job_id=0, team="bench", run="true", setup=None, envs={}, num_nodes=1,
                         placement=WHERE, spec=spec)


def _wait(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.002)
    raise SystemExit("timed out: the reconciler did not launch")


def bench_janitor(kind: str, trials: int, interval: float = 2.0) -> None:
    """Figure 3: see the module's docstring. `interval` is the janitor's
    (300 s by default; shorter here so that the trials take seconds)."""
    from spotbroker.broker.jobs.states import AttemptState
    from spotbroker.broker.launch.skypilot.janitor import run_janitor

    data_dir, engine, factory, settings, drop = _fresh(kind)
    sky = ScriptedSky()
    launcher = SkyPilotLauncher(data_dir, prefix="bench", poll_s=3600, sky=sky)
    rec = Reconciler(factory, {"skypilot": launcher}, settings)
    after_restart, while_running = [], []
    try:
        with transaction(factory) as s:
            seed_from_catalog(s)
            team, _ = auth.create_team(s, "bench")

        def orphan() -> str:
            """A cluster launched by a broker that crashed before storing its handle; its job since cancelled."""
            with transaction(factory) as s:
                job = jobs.submit(s, team.id, JobSpec(run="python train.py"))
                attempt = rec.launching.new_attempt(s, job, JobSpec.model_validate(job.spec), WHERE, "skypilot", "b")
                attempt.state = AttemptState.CANCELLED
                name = cluster_name("bench", attempt.id)
            sky.clusters.append(name)
            return name

        for _ in range(trials):
            name = orphan()
            stop = threading.Event()
            started = time.perf_counter()  # the broker restarts: its janitor starts
            janitor = threading.Thread(target=run_janitor, args=(launcher, factory, interval, stop), daemon=True)
            janitor.start()
            _wait(lambda n=name: n in sky.downed, 30)
            after_restart.append((sky.downed[name] - started) * 1000)
            time.sleep(interval * (0.1 + 0.8 * (len(while_running) % 5) / 4))  # anywhere in the interval
            name = orphan()
            appeared = time.perf_counter()
            _wait(lambda n=name: n in sky.downed, 3 * interval)
            while_running.append(sky.downed[name] - appeared)
            stop.set()
            janitor.join(timeout=10)
    finally:
        engine.dispose()
        drop()
    print(f"{kind}: broker restart -> orphan's sky.down request: median {statistics.median(after_restart):.0f} ms, "
          f"max {max(after_restart):.0f} ms over {trials} restarts")
    print(f"{kind}: orphan left while the janitor runs -> its sky.down request: at most "
          f"{max(while_running) / interval:.2f} janitor intervals over {trials} orphans (goal <= 1)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=50)
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    ap.add_argument("--trials", type=int, default=10, help="capacity refusals and orphans timed")
    ap.add_argument("--only", choices=["pass", "capacity", "janitor"])
    args = ap.parse_args()
    for kind in (["sqlite", "postgresql"] if args.db == "both" else [args.db]):
        if args.only in (None, "pass"):
            bench_pass(kind, args.launches, args.passes)
        if args.only in (None, "capacity"):
            bench_capacity(kind, args.trials)
        if args.only in (None, "janitor"):
            bench_janitor(kind, args.trials)


if __name__ == "__main__":
    sys.exit(main())
