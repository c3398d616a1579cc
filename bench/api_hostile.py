"""What hostile or careless clients cost a real `spotbroker serve` process.

1. Log followers: followers of a running job's log are added step by step
   (each an open `GET /v1/jobs/{id}/logs?follow=true`); at each step another
   team's `GET /v1/jobs` is timed, one request every 50 ms for --seconds.
   The figure is the most followers held with that p99 <= 100 ms.
2. Memory: the server's RSS after a warm-up, then after --rounds of the
   bad-input suite (NUL bytes, deep nesting, YAML alias bombs, huge and
   non-finite numbers, 10 MB bodies, wrong content types, ids past BIGINT).
3. SIGTERM with 50 followers attached: seconds from the signal to the exit.

    python bench/api_hostile.py                          # PostgreSQL
    python bench/api_hostile.py --db sqlite --steps 100,500 --seconds 5
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _db import temporary_database

ADMIN = "bench-admin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    def __init__(self, db_url: str, data_dir: Path, **settings: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
        env.update(SPOTBROKER_DATABASE_URL=db_url, SPOTBROKER_DATA_DIR=str(data_dir), SPOTBROKER_ADMIN_TOKEN=ADMIN,
                   SPOTBROKER_LOCAL_MAX_RUNNING="4", SPOTBROKER_MAX_FOLLOWERS_PER_TEAM="100000",
                   SPOTBROKER_RECONCILE_INTERVAL="0.5", SPOTBROKER_PRICES_SOURCES="catalog",  # no network
                   **settings)
        cli = [sys.executable, "-m", "spotbroker.broker.cli"]
        subprocess.run([*cli, "db", "upgrade"], env=env, check=True, capture_output=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        self.proc = subprocess.Popen([*cli, "serve", "--port", str(self.port), "--log-level", "warning"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit("the broker did not start")
            time.sleep(0.2)

    def team(self, name: str) -> str:
        r = httpx.post(f"{self.url}/v1/teams", json={"name": name}, headers={"Authorization": f"Bearer {ADMIN}"})
        return r.json()["token"]

    def running_job(self, token: str) -> int:
        h = {"Authorization": f"Bearer {token}"}
        job_id = httpx.post(f"{self.url}/v1/jobs", headers=h, json={
            "name": "ticker", "run": "while :; do echo tick; sleep 1; done"}).json()["id"]
        deadline = time.monotonic() + 60
        while httpx.get(f"{self.url}/v1/jobs/{job_id}", headers=h).json()["state"] != "RUNNING":
            if time.monotonic() > deadline:
                raise SystemExit("the job did not start")
            time.sleep(0.2)
        return job_id

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        for node in (self.data_dir / "runs").glob("*/node-*.json"):  # local nodes outlive the broker
            try:
                import json

                os.kill(json.loads(node.read_text())["pid"], signal.SIGTERM)
            except (OSError, ValueError, KeyError):
                pass


class Followers:
    """Open follow streams on raw sockets, read and dropped: a client that
    costs little CPU next to the server it measures."""

    def __init__(self, port: int, job_id: int, token: str) -> None:
        self.port = port
        self.request = (f"GET /v1/jobs/{job_id}/logs?follow=true HTTP/1.1\r\nHost: x\r\n"
                        f"Authorization: Bearer {token}\r\n\r\n").encode()
        self.tasks: list[asyncio.Task] = []
        self.refused = 0

    async def add(self, n: int) -> None:
        opened = [asyncio.get_running_loop().create_future() for _ in range(n)]
        self.tasks += [asyncio.create_task(self._one(f)) for f in opened]
        await asyncio.gather(*opened)

    async def _one(self, opened: asyncio.Future) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(self.request)
        status = await reader.readline()
        if b" 200 " not in status:
            self.refused += 1
        opened.set_result(None)
        try:
            while await reader.read(65536):
                pass
        finally:
            writer.close()

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks = []


async def probe(port: int, token: str, seconds: float) -> list[float]:
    """Another team's GET /v1/jobs every 50 ms on one keep-alive connection: latencies in ms."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    raw = f"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    out, start = [], time.monotonic()
    for i in range(int(seconds / 0.05)):
        await asyncio.sleep(max(0.0, start + i * 0.05 - time.monotonic()))
        t0 = time.perf_counter()
        writer.write(raw)
        status = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await reader.readexactly(length)
        assert b" 200 " in status, status
        out.append((time.perf_counter() - t0) * 1000)
    writer.close()
    return out


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def followers_figure(broker: Broker, steps: list[int], seconds: float) -> int:
    followed, other = broker.team("followed"), broker.team("other")
    for i in range(10):  # something for the other team's list to hold
        httpx.post(f"{broker.url}/v1/jobs", json={"name": f"o{i}", "run": "true"},
                   headers={"Authorization": f"Bearer {other}"})
    job_id = broker.running_job(followed)
    followers, held = Followers(broker.port, job_id, followed), 0
    print("followers | GET /v1/jobs p50 / p99 / max (ms) | server RSS (MiB)")
    for target in steps:
        await followers.add(target - len(followers.tasks))
        await asyncio.sleep(2)
        ms = await probe(broker.port, other, seconds)
        ok = pct(ms, 99) <= 100 and followers.refused == 0
        print(f"{target:9d} | {pct(ms, 50):6.1f} / {pct(ms, 99):6.1f} / {max(ms):6.1f}"
              f"{'' if ok else '   over the limit'} | {broker.rss_mib():.0f}", flush=True)
        if not ok:
            break
        held = target
    await followers.close()
    return held


BAD = [
    (b'{"run": "echo \\u0000"}', "application/json"),
    (b'{"run": "x", "envs": {"A": "b\\u0000"}}', "application/json"),
    (b'{"run": "x", "envs": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", "application/json"),
    (b"run: x\nenvs: " + b"[" * 200_000 + b"]" * 200_000 + b"\n", "application/yaml"),
    (b"big: &big " + b"x" * 50_000 + b"\nrun: echo\nenvs:\n" + b"".join(b"  V%d: *big\n" % i for i in range(1000)),
     "application/yaml"),
    (b'{"run": "x", "num_nodes": 1' + b"0" * 5000 + b"}", "application/json"),
    (b'{"run": "x", "resources": {"max_price_per_hour": Infinity}}', "application/json"),
    (b'{"run": "x", "resources": {"accelerators": "A100:1e309"}}', "application/json"),
    (b'{"run": "x", "estimated_hours": 1, "deadline": "9999-12-31T00:00:00Z"}', "application/json"),
    (b'{"run": "x"' + b" " * (10 << 20) + b"}", "application/json"),
    (b'{"run": "x"}', "text/xml"),
]
YAML_JOB = (b"name: warm-%d\nrun: python train.py\nenvs: {SEED: 7}\n"
            b"resources: {accelerators: {A10G: 1, L4: 1}, use_spot: true}\n")
BAD_PATHS = ["/v1/jobs/74557315999538612273152/checkpoints", "/v1/jobs?cursor=74557315999538612273152",
             "/v1/jobs/1/events?after=74557315999538612273152"]


def memory_figure(broker: Broker, rounds: int) -> tuple[float, float]:
    token = broker.team("hostile")
    h = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=broker.url, timeout=60) as c:
        for i in range(20):  # warm-up: ordinary traffic, JSON and YAML
            c.post("/v1/jobs", json={"run": "true"}, headers=h)
            c.post("/v1/jobs", content=YAML_JOB % i, headers={**h, "Content-Type": "application/yaml"})
            c.get("/v1/jobs", headers=h)
        before = broker.rss_mib()
        statuses = set()
        for _ in range(rounds):
            for body, ctype in BAD:
                statuses.add(c.post("/v1/jobs", content=body, headers={**h, "Content-Type": ctype}).status_code)
            for path in BAD_PATHS:
                statuses.add(c.get(path, headers=h).status_code)
        time.sleep(1)
        after = broker.rss_mib()
    assert all(400 <= s < 500 for s in statuses), statuses
    return before, after


async def sigterm_figure(broker: Broker, n: int) -> float:
    token = broker.team("sigterm")
    job_id = broker.running_job(token)
    followers = Followers(broker.port, job_id, token)
    await followers.add(n)
    await asyncio.sleep(1)
    assert followers.refused == 0
    started = time.monotonic()
    broker.proc.send_signal(signal.SIGTERM)
    while broker.proc.poll() is None and time.monotonic() - started < 60:
        await asyncio.sleep(0.01)
    took = time.monotonic() - started
    await followers.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--steps", default="100,250,500,750,1000,1500,2000,3000")
    parser.add_argument("--seconds", type=float, default=10.0, help="of probing at each step")
    parser.add_argument("--rounds", type=int, default=20, help="of the bad-input suite")
    parser.add_argument("--sigterm-runs", type=int, default=3)
    args = parser.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    with tempfile.TemporaryDirectory(prefix="spotbroker-bench-") as tmp:
        os.chmod(tmp, 0o711)  # local jobs may run as another user: they must reach their node dir
        runs = []
        for part in ("followers", "memory", *[f"sigterm{i}" for i in range(args.sigterm_runs)]):
            data_dir = Path(tmp) / part
            db_url, drop = temporary_database(args.db, Path(tmp))
            broker = Broker(db_url, data_dir)
            try:
                if part == "followers":
                    held = asyncio.run(followers_figure(broker, steps, args.seconds))
                    print(f"followers held with another team's p99 <= 100 ms: {held}\n")
                elif part == "memory":
                    before, after = memory_figure(broker, args.rounds)
                    print(f"server RSS: {before:.1f} MiB before, {after:.1f} MiB after {args.rounds} rounds of "
                          f"the bad-input suite ({(after / before - 1) * 100:+.1f} %)\n")
                else:
                    runs.append(asyncio.run(sigterm_figure(broker, 50)))
                    print(f"SIGTERM with 50 followers attached: exited in {runs[-1]:.2f} s", flush=True)
            finally:
                broker.stop()
                drop()


if __name__ == "__main__":
    main()
