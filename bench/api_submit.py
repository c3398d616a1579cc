"""Job submissions per second that `spotbroker serve` holds with p99 <= 100 ms.

Open-loop load: requests leave on a fixed schedule whatever the answers do
(a closed loop would slow down with the server and hide its queueing). Each
rate runs for --seconds; the rate steps up until p99 passes the limit or a
request fails. Jobs stay PENDING behind the local launcher's cap (0 slots),
so what is measured is the API: auth, validation, the insert, the answer.

    python bench/api_submit.py                     # PostgreSQL and SQLite
    python bench/api_submit.py --db sqlite --rates 100,200 --seconds 5
    python bench/api_submit.py --db postgresql --replicas 2   # two brokers on one database, requests alternating
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _db import temporary_database

TEAMS = 50
JOB = {"name": "bench", "run": "python train.py", "resources": {"accelerators": "A100:1"}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_broker(db_url: str, data_dir: Path, workers: int, first: bool = True) -> tuple[subprocess.Popen, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    env.update(SPOTBROKER_DATABASE_URL=db_url, SPOTBROKER_DATA_DIR=str(data_dir),
               SPOTBROKER_LOCAL_MAX_RUNNING="0", SPOTBROKER_ADMIN_TOKEN="bench-admin",
               SPOTBROKER_MAX_UNFINISHED_JOBS_PER_TEAM="1000",  # the default: TEAMS teams share the load
               SPOTBROKER_SECRET_KEY="bench-signing-key-shared-by-the-replicas",
               SPOTBROKER_PRICES_SOURCES="catalog")  # no network
    cli = [sys.executable, "-m", "spotbroker.broker.cli"]
    if first:
        subprocess.run([*cli, "db", "upgrade"], env=env, check=True, capture_output=True)
    port = free_port()
    proc = subprocess.Popen([*cli, "serve", "--port", str(port), "--log-level", "warning",
                             *(["--workers", str(workers)] if workers > 1 else [])], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("the broker did not start")
        time.sleep(0.2)
    # Teams share the load: a team holds at most 1,000 unfinished jobs (the default bound), and the
    # jobs stay PENDING here; 50 teams take 25 minutes of 500/s.
    tokens = [httpx.post(f"{url}/v1/teams", json={"name": f"bench-{i}"},
                         headers={"Authorization": "Bearer bench-admin"}).json()["token"]
              for i in range(TEAMS)] if first else []
    return proc, url, tokens


class Connection:
    """One keep-alive HTTP/1.1 connection speaking just enough HTTP to send a
    pre-built request and read a Content-Length answer. The client must cost
    little CPU: it shares the machine with the server it measures (httpx's
    async client spends about 1 ms a request)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def request(self, raw: bytes) -> int:
        self.writer.write(raw)
        status_line = await self.reader.readline()
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await self.reader.readexactly(length)
        return int(status_line.split()[1])


async def run_rate(urls: list[str], tokens: list[str], rate: float, seconds: float) -> dict:
    """Requests alternate between the brokers at `urls` (replicas on one database), and the teams."""
    body = json.dumps(JOB).encode()
    raws = [(f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
             f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
            for token in tokens]
    pools: list[list[tuple[Connection, float]]] = [[] for _ in urls]  # per broker: (connection, last used)
    latencies: list[float] = []
    errors = 0
    kinds: dict[str, int] = {}

    async def one(scheduled: float, which: int, raw: bytes) -> None:
        nonlocal errors
        idle = pools[which]
        # uvicorn closes a keep-alive connection after 5 s idle: never reuse one that old.
        while idle and time.perf_counter() - idle[0][1] > 4:
            idle.pop(0)[0].writer.close()
        host, port = urls[which].removeprefix("http://").split(":")
        conn = idle.pop()[0] if idle else Connection(*await asyncio.open_connection(host, int(port)))
        try:
            status = await conn.request(raw)
            ok = status == 201
            idle.append((conn, time.perf_counter()))
            if not ok:
                kinds[f"HTTP {status}"] = kinds.get(f"HTTP {status}", 0) + 1
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
            ok = False
            kinds[type(exc).__name__] = kinds.get(type(exc).__name__, 0) + 1
        # Latency from when the request was due, so client lag counts against us too.
        latencies.append(time.perf_counter() - scheduled)
        errors += not ok

    start = time.perf_counter()
    tasks, n = [], int(rate * seconds)
    for i in range(n):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(due, i % len(urls), raws[i % len(raws)])))
    await asyncio.gather(*tasks)
    for conn, _ in (c for idle in pools for c in idle):
        conn.writer.close()
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    if kinds:
        print(f"         errors: {kinds}")
    return {"rate": rate, "sent": n, "errors": errors, "p50": pct(0.50), "p99": pct(0.99), "max": pct(1.0)}


def bench(db: str, rates: list[float], seconds: float, workers: int, replicas: int = 1,
          warmup: float = 15.0) -> float:
    data_dir = Path(tempfile.mkdtemp(prefix="spotbroker-bench-"))
    db_url, drop = temporary_database(db, data_dir)
    procs, urls, tokens = [], [], []
    for i in range(replicas):
        proc, url, got = start_broker(db_url, data_dir / f"replica-{i}" if i else data_dir, workers, first=i == 0)
        procs.append(proc)
        urls.append(url)
        tokens = tokens or got
    best = 0.0
    try:
        print(f"\n{db} ({replicas} replica{'s' if replicas > 1 else ''}, {workers} worker{'s' if workers > 1 else ''}"
              f" each), {seconds:.0f} s per rate")
        print(f"{'rate/s':>8} {'sent':>6} {'errors':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
        if warmup:  # a started broker imports SkyPilot in the background (SPOTBROKER_PRELOAD_SKYPILOT): not measured
            w = asyncio.run(run_rate(urls, tokens, 20, warmup))
            print(f"{'warm-up':>8} {w['sent']:>6} {w['errors']:>6} {w['p50']:>8.1f} {w['p99']:>8.1f} {w['max']:>8.1f}")
        for rate in rates:
            r = asyncio.run(run_rate(urls, tokens, rate, seconds))
            print(f"{r['rate']:>8.0f} {r['sent']:>6} {r['errors']:>6} {r['p50']:>8.1f} {r['p99']:>8.1f} "
                  f"{r['max']:>8.1f}")
            if r["errors"] or r["p99"] > 100:
                break
            best = rate
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
        drop()
    print(f"{db}: highest rate held with p99 <= 100 ms and no errors: {best:.0f} submissions/s")
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", choices=["postgresql", "sqlite", "both"], default="both")
    ap.add_argument("--rates", default="100,200,300,400,500,600,800")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    ap.add_argument("--replicas", type=int, default=1, help="brokers on the one database (PostgreSQL)")
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds at 20/s after the start, not measured "
                    "(the start's background import of SkyPilot halves the API's capacity meanwhile)")
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    for db in (["postgresql", "sqlite"] if args.db == "both" else [args.db]):
        bench(db, rates, args.seconds, args.workers, args.replicas, args.warmup)


if __name__ == "__main__":
    main()
