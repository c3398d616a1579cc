"""The money's figures (issue #14), on PostgreSQL (parts 1 and 2 on SQLite too):

1. the costs API's p50/p99 for a 90-day team view, by each grouping (and
   by a label, as JSON and as CSV), over
   1,000,000 ledger entries (100 teams, 90 days), through HTTP on a real
   server (goal: p99 <= 100 ms); the dashboard's 90-day team page, rendered
   for a team logged in through the form (its session cookie) that has a
   monthly budget, and the admin's overview of every team; and a /metrics
   scrape over the same data. Beside each wall time, the CPU one request
   costs (this process: the server and the client; and PostgreSQL: the
   bench database's backends), which moves far less with the machine's load;
2. one alert evaluation for 1,000 budgeted teams (goal: <= 1 s per pass);
3. ledger rows per running attempt per day, written by the real accrual
   passes as the loop runs them (every interval plus up to one wake-up
   step late), and the table's size on disk (pg_total_relation_size) for
   100 teams x 90 days at that rate, from the seeded table's bytes per row;
4. from the moment spending crosses the fast-burn threshold to a local
   webhook receiver holding the alert, through the real money loop on the
   real clock (goal: <= 1 evaluation interval + 1 s).

    python bench/costs.py [--entries 1000000] [--teams 100] [--requests 60] [--interval 10] [--trials 3]
    python bench/costs.py --only-api [--database sqlite]      # parts 1 and 2 (on SQLite: a file)
    python bench/costs.py --only-costs                        # part 1

Seeding uses COPY on PostgreSQL, so it takes a minute, not ten. Prices come
from the bundled catalog only (SPOTBROKER_PRICES_SOURCES=catalog): the figures are the
ledger's, and a benchmark reaches for no network.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

os.environ.setdefault("SPOTBROKER_PRICES_SOURCES", "catalog")   # before the app reads its settings
# Part 4's webhook receiver listens on loopback, which notification targets
# may reach only when it is listed (docs/money.md, Notifications).
os.environ.setdefault("SPOTBROKER_NOTIFY_ALLOWED_NETWORKS", '["127.0.0.0/8"]')

import httpx  # noqa: E402
from _db import temporary_database  # noqa: E402
from sqlalchemy import func, insert, select, text  # noqa: E402

from spotbroker.broker.money import alerts, budgets  # noqa: E402
from spotbroker.broker.money.accrual import Accruer  # noqa: E402
from spotbroker.broker.money.loop import MoneyLoop  # noqa: E402
from spotbroker.broker.money.settings import MoneySettings  # noqa: E402
from spotbroker.broker.store import migrate  # noqa: E402
from spotbroker.broker.store.db import make_engine, make_session_factory, transaction  # noqa: E402
from spotbroker.broker.store.models import Attempt, Job, JobLabel, Team  # noqa: E402
from spotbroker.broker.store.moneymodels import Budget, LedgerEntry  # noqa: E402
from spotbroker.broker.store.sealing import Keyring  # noqa: E402

ADMIN = "bench-admin-token"
DAYS, JOBS_PER_TEAM = 90, 20
PLACES = [("aws", "us-east-1", "use1-az1", "H100"), ("aws", "us-west-2", "usw2-az2", "A100"),
          ("gcp", "us-central1", "us-central1-a", "L4"), ("azure", "eastus", "eastus-1", "A100")]
LEDGER_COLUMNS = ("team_id", "job_id", "attempt_id", "kind", "start_at", "end_at", "node_hours", "price_per_hour",
                  "amount", "ondemand_amount", "wasted", "cloud", "region", "place", "accelerator", "use_spot",
                  "created_at")


class FixedClock:
    def __init__(self, now: datetime) -> None:
        self.t = now

    def now(self) -> datetime:
        return self.t


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class CpuMeter:
    """CPU seconds spent so far by this process and by the PostgreSQL
    backends connected to the bench database (read from /proc: the server
    runs on this machine). A backend that exits takes its seconds with it,
    and so does a parallel worker: the pool keeps the app's backends, and
    the team views' plans have no parallel workers (the overview's scan of
    every entry does: its database figure is left out)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.tick = os.sysconf("SC_CLK_TCK")

    def _backends(self) -> float | None:
        if self.engine.dialect.name != "postgresql":
            return None                                       # SQLite works in this process
        with self.engine.connect() as c:
            pids = c.scalars(text("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                  "AND pid <> pg_backend_pid()")).all()
        total = 0
        try:
            for pid in pids:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])     # utime, stime
        except (OSError, IndexError, ValueError):
            return None
        return total / self.tick

    def read(self) -> tuple[float, float | None]:
        return time.process_time(), self._backends()

    @staticmethod
    def per_request(before: tuple[float, float | None], after: tuple[float, float | None], n: int) -> str:
        here = f"CPU/request {(after[0] - before[0]) / n * 1000:5.1f} ms here"
        if before[1] is None or after[1] is None:
            return here
        return f"{here} + {(after[1] - before[1]) / n * 1000:5.1f} ms PostgreSQL"


# --- seeding ---------------------------------------------------------------------------


def seed_teams(factory, first: int, count: int, now: datetime) -> list[int]:
    with transaction(factory) as s:
        rows = [{"name": f"team{first + i:04d}", "created_at": now} for i in range(count)]
        return list(s.scalars(insert(Team).returning(Team.id), rows))


def seed_attempts(factory, teams: list[int], now: datetime) -> dict[int, list[tuple[int, int, tuple]]]:
    """Per team: JOBS_PER_TEAM ended jobs of one attempt each, and one running job."""
    out: dict[int, list[tuple[int, int, tuple]]] = {}
    with transaction(factory) as s:
        for team in teams:
            out[team] = []
            for j in range(JOBS_PER_TEAM + 1):
                running = j == JOBS_PER_TEAM
                job = Job(team_id=team, name=f"train-{j}", state="RUNNING" if running else "SUCCEEDED",
                          spec={"run": "true"}, restarts=0, recoveries=0, created_at=now, updated_at=now)
                s.add(job)
                s.flush()
                # Labels as teams allocate: a project on most jobs (some have none), an owner on every one.
                s.add_all([JobLabel(job_id=job.id, team_id=team, key=k, value=v) for k, v in
                           (("owner", f"user{j % 3}"), *((("project", f"p{j % 4}"),) if j % 5 else ()))])
                cloud, region, zone, gpu = PLACES[j % len(PLACES)]
                a = Attempt(job_id=job.id, state="RUNNING" if running else "SUCCEEDED", launcher="skypilot",
                            cloud=cloud, region=region, zone=zone, instance_type="x", accelerator=gpu,
                            accelerator_count=8, use_spot=True, num_nodes=1, price_per_hour=2.0 + j % 5,
                            created_at=now - timedelta(days=DAYS), updated_at=now,
                            started_at=now - timedelta(hours=1) if running else now - timedelta(days=DAYS),
                            ended_at=None if running else now - timedelta(seconds=1),
                            end_reason=None if running else "succeeded")
                s.add(a)
                s.flush()
                if not running:
                    out[team].append((job.id, a.id, PLACES[j % len(PLACES)]))
                    s.execute(text("INSERT INTO ledger_cursors (attempt_id, team_id, accrued_to, closed) "
                                   "VALUES (:a, :t, :at, true)"), {"a": a.id, "t": team, "at": now})
                else:  # written to half a minute ago: readers add the tail, as in a live broker
                    s.execute(text("INSERT INTO ledger_cursors (attempt_id, team_id, accrued_to, closed) "
                                   "VALUES (:a, :t, :at, false)"), {"a": a.id, "t": team,
                                                                    "at": now - timedelta(seconds=30)})
    return out


def seed_ledger(engine, attempts: dict[int, list[tuple[int, int, tuple]]], entries: int, now: datetime) -> float:
    """`entries` usage rows spread evenly over the teams and the last 90 days,
    in time order with the teams interleaved, as accrual appends them (so a
    team's rows lie scattered over the table's pages, as they would after 90
    days of a live broker): by COPY on PostgreSQL, one executemany on SQLite."""
    rng = random.Random(7)
    teams = list(attempts.items())
    span = DAYS * 86400

    def rows():
        for i in range(entries):
            team, runs = teams[i % len(teams)]
            job, attempt, (cloud, region, zone, gpu) = rng.choice(runs)
            start = now - timedelta(seconds=span * (1 - i / entries) + 60)
            price = rng.uniform(1.0, 4.0)
            yield (team, job, attempt, "usage", start, start + timedelta(minutes=1), 1 / 60, price, price / 60,
                   price * 3 / 60, 0.0, cloud, region, zone, gpu, True, start)

    started = time.perf_counter()
    raw = engine.raw_connection()
    try:
        if engine.dialect.name == "sqlite":
            def stored(v):   # as the UTC column type stores a time on SQLite: naive UTC, microseconds
                return v.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f") if isinstance(v, datetime) else v

            marks = ", ".join("?" * len(LEDGER_COLUMNS))
            raw.driver_connection.execute("BEGIN")      # one transaction (the engine's connections autocommit)
            raw.cursor().executemany(f"INSERT INTO ledger_entries ({', '.join(LEDGER_COLUMNS)}) VALUES ({marks})",
                                     (tuple(stored(v) for v in row) for row in rows()))
        else:
            with raw.cursor() as cur, cur.copy(f"COPY ledger_entries ({', '.join(LEDGER_COLUMNS)}) FROM STDIN") as cp:
                for row in rows():
                    cp.write_row(row)
        raw.commit()
    finally:
        raw.close()
    # What autovacuum does to an append-only table after enough inserts: the
    # visibility map lets the covering index answer without the heap.
    raw = engine.raw_connection()
    try:
        if engine.dialect.name == "sqlite":
            raw.driver_connection.execute("ANALYZE")
        else:
            raw.driver_connection.autocommit = True
            raw.driver_connection.execute("VACUUM ANALYZE ledger_entries")
    finally:
        raw.close()
    return time.perf_counter() - started


# --- 1. the costs API and /metrics -------------------------------------------------------


class Served:
    """The whole app on a real socket (no reconciler: nothing to launch)."""

    def __init__(self, url: str, data_dir: Path) -> None:
        import socket

        import uvicorn

        from spotbroker.api.app import create_app
        from spotbroker.broker.settings import Settings

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        settings = Settings(database_url=url, data_dir=data_dir, admin_token=ADMIN, local_launcher=False,
                            port=port, _env_file=None)
        self.server = uvicorn.Server(uvicorn.Config(create_app(settings, run_reconciler=False), host="127.0.0.1",
                                                    port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60,
                                   headers={"Authorization": f"Bearer {ADMIN}"})

    def close(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(timeout=30)


def costs_api(served: Served, names: list[str], requests: int, now: datetime, cpu: CpuMeter) -> None:
    rng = random.Random(11)
    since = (now - timedelta(days=DAYS)).isoformat()
    for route, group_by in ((path, g) for path in ("costs", "costs.csv")
                            for g in (None, "day", "job", "cloud", "gpu", "zone", "label:project")):
        if route == "costs.csv" and group_by not in ("job", "label:project"):
            continue
        params = {"since": since} | ({"group_by": group_by} if group_by else {})
        served.client.get(f"/v1/teams/{names[0]}/{route}", params=params).raise_for_status()  # warm
        times, before = [], cpu.read()
        for _ in range(requests):
            t = time.perf_counter()
            r = served.client.get(f"/v1/teams/{rng.choice(names)}/{route}", params=params)
            times.append((time.perf_counter() - t) * 1000)
            r.raise_for_status()
        used = cpu.per_request(before, cpu.read(), requests)
        groups = len(r.json()["groups"]) if route == "costs" else len(r.text.splitlines()) - 1
        print(f"  GET /v1/teams/{{team}}/{route:9}?since=-90d&group_by={group_by or '-':13}  "
              f"p50 {statistics.median(times):6.1f} ms  p99 {pct(times, 0.99):6.1f} ms  {used}  "
              f"({requests} requests, {groups} groups)")
    dashboard(served, names, requests, rng, cpu)
    times = []
    for _ in range(10):
        t = time.perf_counter()
        served.client.get("/metrics").raise_for_status()
        times.append((time.perf_counter() - t) * 1000)
    print(f"  GET /metrics (every team)                      p50 {statistics.median(times):6.1f} ms  "
          f"max {max(times):6.1f} ms  (10 scrapes)")


def dashboard(served: Served, names: list[str], requests: int, rng: random.Random, cpu: CpuMeter) -> None:
    """The 90-day team page as a browser gets it: a team's token logs in
    through the form once, then the page is requested with its cookie. Each
    of these teams has a monthly budget (its page draws the burn chart)."""
    browsers = {}
    for name in names[:10]:
        served.client.put(f"/v1/teams/{name}/budget", json={"amount": 5000, "period": "month"}).raise_for_status()
        token = served.client.post(f"/v1/teams/{name}/tokens").json()["token"]
        browser = httpx.Client(base_url=served.client.base_url, timeout=60)
        r = browser.post("/dashboard/login", data={"token": token}, headers={"Origin": str(served.client.base_url)})
        assert r.status_code == 303 and browser.cookies, r.text
        browsers[name] = browser
    try:
        for name, browser in browsers.items():
            browser.get(f"/dashboard/teams/{name}", params={"days": DAYS}).raise_for_status()   # warm
        times, before = [], cpu.read()
        for _ in range(requests):
            name = rng.choice(list(browsers))
            t = time.perf_counter()
            r = browsers[name].get(f"/dashboard/teams/{name}", params={"days": DAYS})
            times.append((time.perf_counter() - t) * 1000)
            assert r.status_code == 200 and f"Team {name}" in r.text and "burn-chart" in r.text, r.status_code
        used = cpu.per_request(before, cpu.read(), requests)
        print(f"  GET /dashboard/teams/{{team}}?days=90, a team's session  p50 {statistics.median(times):6.1f} ms  "
              f"p99 {pct(times, 0.99):6.1f} ms  {used}  ({requests} pages, {len(r.content) // 1024} KiB)")
    finally:
        for browser in browsers.values():
            browser.close()
    times, before = [], time.process_time()
    for _ in range(10):
        t = time.perf_counter()
        served.client.get("/dashboard", params={"days": DAYS}).raise_for_status()
        times.append((time.perf_counter() - t) * 1000)
    print(f"  GET /dashboard?days=90, the admin's overview (every team) p50 {statistics.median(times):6.1f} ms  "
          f"max {max(times):6.1f} ms  CPU/request {(time.process_time() - before) * 100:5.1f} ms here  (10 pages)")


# --- 2. alert evaluation -----------------------------------------------------------------


def alert_passes(factory, teams: list[int], now: datetime, passes: int = 5) -> None:
    rng = random.Random(13)
    rules = budgets.Rules().model_dump()
    with transaction(factory) as s:
        unset = sorted(set(teams) - set(s.scalars(select(Budget.team_id))))   # part 1 set the dashboard's
        s.execute(insert(Budget), [{"team_id": t, "amount": rng.choice([50.0, 500.0, 5000.0, 50000.0]),
                                    "period": rng.choice(["day", "week", "month"]), "hard_cap_action": "hold_new",
                                    "recoveries": "allow", "rules": rules, "targets": [], "created_at": now,
                                    "updated_at": now} for t in unset])
    times, opened = [], []
    for _ in range(passes):
        t = time.perf_counter()
        with transaction(factory) as s:
            o, _ = alerts.evaluate(s, now)
        times.append(time.perf_counter() - t)
        opened.append(o)
    print(f"  alerts.evaluate, {len(teams)} budgeted teams: first pass {times[0] * 1000:.0f} ms "
          f"(opened {opened[0]} alerts), then median {statistics.median(times[1:]) * 1000:.0f} ms, "
          f"max {max(times[1:]) * 1000:.0f} ms")


# --- 3. ledger growth --------------------------------------------------------------------


def growth(factory, hours: float, interval: float) -> float:
    """Rows one running attempt gets per day from the loop's accrual passes.
    The loop wakes every `step` seconds and accrues when the interval is due
    (under its lease), so passes land off the interval's grid, as in a broker."""
    start = datetime(2026, 11, 2, 0, 0, 7, 300000, tzinfo=UTC)
    (team,) = seed_teams(factory, 9000, 1, start)
    with transaction(factory) as s:
        job = Job(team_id=team, name="long", state="RUNNING", spec={"run": "true"}, restarts=0, recoveries=0,
                  created_at=start, updated_at=start)
        s.add(job)
        s.flush()
        s.add(Attempt(job_id=job.id, state="RUNNING", launcher="skypilot", cloud="aws", region="us-east-1",
                      zone="us-east-1a", instance_type="p5.48xlarge", accelerator="H100", accelerator_count=8,
                      use_spot=True, num_nodes=1, price_per_hour=30.0, created_at=start, updated_at=start,
                      started_at=start))
    clock = FixedClock(start)
    accruer = Accruer(factory, MoneySettings(_env_file=None, accrual_interval=interval), clock=clock)
    step = max(0.05, min(5.0, interval / 4))    # as MoneyLoop._loop wakes
    while clock.t < start + timedelta(hours=hours):
        clock.t += timedelta(seconds=step)
        accruer.pass_once()
    with factory() as s:
        rows = s.scalar(select(func.count()).select_from(LedgerEntry).where(LedgerEntry.team_id == team))
    per_day = rows * 24 / hours
    print(f"  {per_day:.0f} rows per running attempt per day (60 s accrual interval, the loop's passes over "
          f"{hours:g} h; whole minutes are written, the last one not yet)")
    return per_day


def table_size(engine, entries: int, rows_per_day: float, teams: int) -> None:
    with engine.connect() as c:
        total = c.scalar(text("SELECT pg_total_relation_size('ledger_entries')"))
        heap = c.scalar(text("SELECT pg_relation_size('ledger_entries')"))
    per_row = total / entries
    rows = rows_per_day * DAYS * teams
    print(f"  seeded table: {entries:,} rows, {total / 2**20:.0f} MiB with its indexes "
          f"({heap / 2**20:.0f} MiB heap), {per_row:.0f} bytes per row")
    print(f"  {teams} teams x {DAYS} days x 1 attempt running all the time x {rows_per_day:.0f} rows/day = "
          f"{rows / 1e6:.1f} M rows, about {rows * per_row / 2**30:.1f} GiB")


# --- 4. threshold crossing -> webhook -----------------------------------------------------


class Receiver:
    def __init__(self) -> None:
        self.got: list[tuple[float, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.got.append((time.time(), json.loads(body)["text"]))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/T0/B0/bench"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def crossing_to_webhook(factory, interval: float, trials: int) -> None:
    """Each trial: a new team with a $10,000 monthly budget starts a job whose
    price crosses the fast-burn threshold `lead` seconds after its start (a
    random phase against the loop's passes); the loop runs on the real clock."""
    receiver, rng = Receiver(), random.Random(17)
    settings = MoneySettings(_env_file=None, accrual_interval=min(interval, 60), alert_interval=interval,
                             notify_retry_seconds=1)
    keyring = Keyring.from_material([b"bench key"])  # seals the webhook target, opens it to send
    loop, stop = MoneyLoop(factory, settings, keyring=keyring), threading.Event()
    thread = loop.start(stop)
    rules = {"fast_burn": True, "slow_burn": False, "forecast": False, "thresholds": [100], "committed_hours": 0.001}
    latencies = []
    try:
        for trial in range(trials):
            now = datetime.now(UTC)
            (team,) = seed_teams(factory, 8000 + trial, 1, now)
            name = f"team{8000 + trial:04d}"
            with transaction(factory) as s:
                budgets.put(s, team, budgets.BudgetIn.model_validate({"amount": 10000, "period": "month",
                            "rules": rules, "targets": [{"name": "hook", "kind": "webhook", "url": receiver.url}]}),
                            keyring=keyring)
                even = 10000 / budgets.period_of("month", now).hours
                lead = rng.uniform(interval, 2 * interval)
                price = alerts.FAST * even * 3600 / lead          # 1 h window reaches 14.4x at start + lead
                job = Job(team_id=team, name="burn", state="RUNNING", spec={"run": "true"}, restarts=0,
                          recoveries=0, created_at=now, updated_at=now)
                s.add(job)
                s.flush()
                start = datetime.now(UTC)
                s.add(Attempt(job_id=job.id, state="RUNNING", launcher="skypilot", cloud="aws", region="us-east-1",
                              zone="us-east-1a", instance_type="p5.48xlarge", accelerator="H100",
                              accelerator_count=8, use_spot=False, num_nodes=1, price_per_hour=price,
                              created_at=start, updated_at=start, started_at=start))
            crossing = start.timestamp() + lead
            deadline = time.time() + lead + 3 * interval + 30
            while time.time() < deadline and not [t for t, m in receiver.got if name in m and "fast burn" in m]:
                time.sleep(0.05)
            got = [t for t, m in receiver.got if name in m and "fast burn" in m]
            latencies.append(got[0] - crossing if got else float("inf"))
            print(f"  trial {trial + 1}: crossing {lead:.1f} s after the start, webhook {latencies[-1]:.2f} s later")
    finally:
        stop.set()
        loop.hint()
        thread.join(timeout=30)
        receiver.server.shutdown()
    print(f"  crossing -> webhook, evaluation interval {interval:g} s: max {max(latencies):.2f} s, "
          f"median {statistics.median(latencies):.2f} s (goal <= {interval + 1:g} s)")


def fresh(data_dir: Path, run):
    """`run(factory)` on a database of its own (no lease or ledger of the parts before)."""
    url, drop = temporary_database("postgresql", data_dir)
    engine = make_engine(url)
    try:
        migrate.upgrade(engine)
        return run(make_session_factory(engine))
    finally:
        engine.dispose()
        drop()


# --- main --------------------------------------------------------------------------------


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--entries", type=int, default=1_000_000)
    p.add_argument("--teams", type=int, default=100)
    p.add_argument("--alert-teams", type=int, default=1000)
    p.add_argument("--requests", type=int, default=60, help="per grouping")
    p.add_argument("--interval", type=float, default=10.0, help="evaluation interval of the webhook trials")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--growth-hours", type=float, default=2.0)
    p.add_argument("--only-api", action="store_true", help="parts 1 and 2 only")
    p.add_argument("--only-costs", action="store_true", help="part 1 only")
    p.add_argument("--only-alerts", action="store_true", help="part 2 only (on the same seeded ledger)")
    p.add_argument("--database", choices=("postgresql", "sqlite"), default="postgresql",
                   help="for parts 1 and 2 (with sqlite, only those run: 3 and 4 measure PostgreSQL)")
    args = p.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    data_dir = Path(tempfile.mkdtemp(prefix="spotbroker-bench-"))
    url, drop = temporary_database(args.database, data_dir)
    engine = make_engine(url)
    try:
        migrate.upgrade(engine)
        factory = make_session_factory(engine)
        now = datetime.now(UTC)
        t = time.perf_counter()
        teams = seed_teams(factory, 0, args.teams, now)
        attempts = seed_attempts(factory, teams, now)
        copy_s = seed_ledger(engine, attempts, args.entries, now)
        print(f"seeded {args.entries:,} entries for {args.teams} teams over {DAYS} days on {args.database} in "
              f"{time.perf_counter() - t:.0f} s (the entries {copy_s:.0f} s)")
        if not args.only_alerts:
            print("1. costs API, 90-day team view, through HTTP:")
            served = Served(url, data_dir)
            try:
                costs_api(served, [f"team{i:04d}" for i in range(args.teams)], args.requests, now, CpuMeter(engine))
            finally:
                served.close()
        if args.only_costs:
            return
        print("2. alert evaluation:")
        more = seed_teams(factory, args.teams, args.alert_teams - args.teams, now)
        alert_passes(factory, teams + more, now)
        if args.only_api or args.only_alerts or args.database != "postgresql":
            return
        print("3. ledger growth:")
        table_size(engine, args.entries, fresh(data_dir, lambda f: growth(f, args.growth_hours, 60.0)), args.teams)
        print("4. threshold crossing -> webhook:")
        fresh(data_dir, lambda f: crossing_to_webhook(f, args.interval, args.trials))
    finally:
        engine.dispose()
        drop()
        shutil.rmtree(data_dir, ignore_errors=True)
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
