"""Attempt logs in the shared store, measured on real `spotbroker serve`
processes (issues #22 and #24).

1. Replicas: two brokers on one database, each with its own data dir. A
   line is shipped to A as a node agent ships it (POST /v1/agent/logs with
   the attempt's token) every --interval s; a follower attached to B
   (`GET /v1/jobs/{id}/logs?follow=true`, a raw socket) sees it: seconds
   from the POST's start to the line on B, p50 / p99 / max.
2. A 100 MiB log (shipped in 4 MiB chunks): the broker's RSS (from /proc)
   and another team's GET /v1/jobs (every 50 ms) while 8 clients read the
   whole log and 8 follow it without reading; then tail=2 of a log whose
   last line but one is 32 MiB long.

    python bench/log_store.py                 # PostgreSQL
    python bench/log_store.py --db sqlite --lines 100
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import multiprocessing
import os
import tempfile
import threading
import time
from base64 import urlsafe_b64encode
from pathlib import Path

import httpx
from _db import temporary_database
from api_hostile import Broker, pct

KEY = "bench-log-store-key"  # shared by the replicas, as brokers on one database must share it
MIB = 1 << 20


def agent_headers(attempt_id: int) -> dict[str, str]:
    """The attempt's agent token, derived as the broker derives it (broker/recovery/agent_channel.py)."""
    mac = hmac.new(KEY.encode(), f"spotbroker-agent:{attempt_id}".encode(), hashlib.sha256).digest()
    return {"Authorization": "Bearer sba_" + urlsafe_b64encode(mac).decode().rstrip("=")}


def quiet_job(broker: Broker, token: str) -> tuple[int, dict[str, str]]:
    """A running job that prints nothing (its log is what the bench ships), and its agent's headers."""
    h = {"Authorization": f"Bearer {token}"}
    job_id = httpx.post(f"{broker.url}/v1/jobs", headers=h, json={"run": "sleep 600"}).json()["id"]
    deadline = time.monotonic() + 60
    while (job := httpx.get(f"{broker.url}/v1/jobs/{job_id}", headers=h).json())["state"] != "RUNNING":
        if time.monotonic() > deadline:
            raise SystemExit("the job did not start")
        time.sleep(0.2)
    return job_id, agent_headers(job["attempts"][-1]["id"])


def ship(url: str, agent: dict[str, str], offset: int, chunk: bytes) -> int:
    r = httpx.post(f"{url}/v1/agent/logs", content=chunk, headers={**agent, "X-Log-Offset": str(offset)}, timeout=120)
    r.raise_for_status()
    return r.json()["size"]


async def replicas_figure(a: Broker, b: Broker, lines: int, interval: float) -> list[float]:
    token = a.team("replicas")
    job_id, agent = quiet_job(a, token)
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    writer.write(f"GET /v1/jobs/{job_id}/logs?follow=true HTTP/1.1\r\nHost: x\r\n"
                 f"Authorization: Bearer {token}\r\n\r\n".encode())
    assert b" 200 " in await reader.readline()
    while await reader.readline() not in (b"\r\n", b""):
        pass
    seen: dict[int, float] = {}

    async def follow() -> None:
        buffered = b""
        while len(seen) < lines:
            buffered += await reader.read(65536)
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                if line.startswith(b"line "):
                    seen.setdefault(int(line.split()[1]), time.monotonic())

    follower = asyncio.create_task(follow())
    await asyncio.sleep(1)
    shipped, offset = {}, 0
    async with httpx.AsyncClient(base_url=a.url, timeout=30) as c:
        for i in range(lines):
            chunk = f"line {i}\n".encode()
            shipped[i] = time.monotonic()
            r = await c.post("/v1/agent/logs", content=chunk, headers={**agent, "X-Log-Offset": str(offset)})
            offset = r.json()["size"]
            await asyncio.sleep(interval)
    await asyncio.wait_for(follower, 30)
    writer.close()
    return [seen[i] - shipped[i] for i in range(lines)]


def rss_sampler(broker: Broker, stop: threading.Event, peak: list[float]) -> None:
    while not stop.is_set():
        peak.append(broker.rss_mib())
        time.sleep(0.05)


def probe(url: str, token: str, stop, out) -> None:
    """Another team's GET /v1/jobs every 50 ms, in a process of its own (the
    readers' client would otherwise share its interpreter): ms, into `out`."""
    latencies = []
    with httpx.Client(base_url=url, timeout=30) as c:
        while not stop.is_set():
            started = time.perf_counter()
            c.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"}).raise_for_status()
            latencies.append((time.perf_counter() - started) * 1000)
            time.sleep(0.05)
    out.put(latencies)


async def raw_get(port: int, path: str, token: str, read: bool, hold: asyncio.Event) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {token}\r\n\r\n"
                 .encode())
    got = 0
    try:
        if not read:
            await hold.wait()
            return 0
        while chunk := await reader.read(1 << 16):
            got += len(chunk)
        return got
    finally:
        writer.close()


async def sixteen(broker: Broker, job_id: int, token: str) -> float:
    hold = asyncio.Event()
    path = f"/v1/jobs/{job_id}/logs"
    idle = [asyncio.create_task(raw_get(broker.port, path + "?follow=true", token, False, hold)) for _ in range(8)]
    started = time.monotonic()
    await asyncio.gather(*[raw_get(broker.port, path, token, True, hold) for _ in range(8)])
    took = time.monotonic() - started
    hold.set()
    await asyncio.gather(*idle)
    return took


def big_log_figures(broker: Broker) -> None:
    token, other = broker.team("big"), broker.team("other")
    job_id, agent = quiet_job(broker, token)
    line = b"x" * 1023 + b"\n"
    offset, started = 0, time.monotonic()
    for _ in range(25):
        offset = ship(broker.url, agent, offset, line * (4 * MIB // len(line)))
    print(f"100 MiB shipped to the store in {time.monotonic() - started:.1f} s (25 chunks of 4 MiB)")
    before = broker.rss_mib()
    stop, peak = threading.Event(), [before]
    sampler = threading.Thread(target=rss_sampler, args=(broker, stop, peak))
    spawn = multiprocessing.get_context("spawn")
    probe_stop, probe_out = spawn.Event(), spawn.Queue()
    prober = spawn.Process(target=probe, args=(broker.url, other, probe_stop, probe_out))
    sampler.start()
    prober.start()
    time.sleep(2)  # the probe's interpreter has started
    took = asyncio.run(sixteen(broker, job_id, token))
    stop.set()
    probe_stop.set()
    latencies = probe_out.get(timeout=60)
    prober.join()
    sampler.join()
    print(f"8 whole reads + 8 idle followers of 100 MiB: broker RSS {before:.0f} -> peak {max(peak):.0f} MiB "
          f"(+{max(peak) - before:.0f}); the reads took {took:.1f} s; another team's GET /v1/jobs "
          f"p50 / p99 / max {pct(latencies, 50):.0f} / {pct(latencies, 99):.0f} / {max(latencies):.0f} ms "
          f"({len(latencies)} requests)")
    job_id, agent = quiet_job(broker, token)
    offset = ship(broker.url, agent, 0, b"short line\n" * (1 << 18))
    for _ in range(8):
        offset = ship(broker.url, agent, offset, b"z" * (4 * MIB))
    ship(broker.url, agent, offset, b"\nend\n")
    for lines in (1, 2):
        started = time.monotonic()
        r = httpx.get(f"{broker.url}/v1/jobs/{job_id}/logs", params={"tail": lines},
                      headers={"Authorization": f"Bearer {token}"}, timeout=120)
        print(f"tail={lines} of a 35 MiB log whose last line but one is 32 MiB: {len(r.content) / MIB:.1f} MiB in "
              f"{time.monotonic() - started:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--lines", type=int, default=200, help="shipped to replica A, one every --interval s")
    parser.add_argument("--interval", type=float, default=0.1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="spotbroker-bench-") as tmp:
        os.chmod(tmp, 0o711)  # local jobs may run as another user: they must reach their node dir
        db_url, drop = temporary_database(args.db, Path(tmp))
        brokers = []
        try:
            for name in ("a", "b"):
                brokers.append(Broker(db_url, Path(tmp) / name, SPOTBROKER_SECRET_KEY=KEY,
                                      SPOTBROKER_MAX_LOG_BYTES=str(200 * MIB)))
            delays = asyncio.run(replicas_figure(*brokers, args.lines, args.interval))
            ms = [d * 1000 for d in delays]
            print(f"line shipped to replica A -> seen by a follower on replica B ({args.db}, {args.lines} lines): "
                  f"p50 {pct(ms, 50):.0f} ms, p99 {pct(ms, 99):.0f} ms, max {max(ms):.0f} ms")
            big_log_figures(brokers[0])
        finally:
            for broker in brokers:
                broker.stop()
            drop()


if __name__ == "__main__":
    main()
