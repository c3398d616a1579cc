"""Attempt logs in the shared store, against real `spotbroker serve`
processes: what an agent ships to one replica is read and followed on
another, and reading a big log costs the broker a bounded amount of memory
(its RSS measured from outside, as issue #24 measured it) and other teams
nothing they would notice."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
from conftest import ADMIN_TOKEN
from support.helpers import wait_for

from spotbroker.broker.recovery.agent_channel import agent_token

MIB = 1 << 20


def team(url: str, name: str) -> dict[str, str]:
    r = httpx.post(f"{url}/v1/teams", json={"name": name}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def running_job(url: str, h: dict[str, str], settings) -> tuple[int, dict[str, str]]:
    """A job that runs (and prints nothing), and its agent's headers."""
    job_id = httpx.post(f"{url}/v1/jobs", json={"run": "sleep 120"}, headers=h).json()["id"]
    wait_for(lambda: httpx.get(f"{url}/v1/jobs/{job_id}", headers=h).json()["state"] == "RUNNING", timeout=60,
             what="the job to run")
    attempt = httpx.get(f"{url}/v1/jobs/{job_id}", headers=h).json()["attempts"][-1]["id"]
    return job_id, {"Authorization": f"Bearer {agent_token(settings.signing_key(), attempt)}"}


def ship(url: str, agent: dict[str, str], offset: int, chunk: bytes, node: int | None = None) -> int:
    headers = {**agent, "X-Log-Offset": str(offset)} | ({"X-Log-Node": str(node)} if node is not None else {})
    r = httpx.post(f"{url}/v1/agent/logs", content=chunk, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["size"]


def test_a_line_shipped_to_one_replica_is_served_and_followed_on_the_other(serve_process, data_dir, settings):
    """Two replicas on one database, each with its own disk (and the one
    checkpoint root replicas share): a follower on B sees within 1 s the
    line an agent shipped to A, and B's GET has it."""
    root = (data_dir / "checkpoints").as_uri()
    with ExitStack() as stack:
        a = stack.enter_context(serve_process(SPOTBROKER_CHECKPOINT_ROOT=root))
        b = stack.enter_context(serve_process(disk=data_dir.parent / "replica-b",  # where a job's user can enter
                                              SPOTBROKER_CHECKPOINT_ROOT=root))
        h = team(a.url, "ml")
        job_id, agent = running_job(a.url, h, settings)
        seen: dict[str, float] = {}
        attached = threading.Event()

        def follow_on_b() -> None:
            with httpx.stream("GET", f"{b.url}/v1/jobs/{job_id}/logs", params={"follow": "true"}, headers=h,
                              timeout=30) as r:
                assert r.status_code == 200
                attached.set()
                body = b""
                for chunk in r.iter_bytes():
                    body += chunk
                    if b"shipped to a\n" in body:
                        seen["at"] = time.monotonic()
                        return

        follower = threading.Thread(target=follow_on_b, daemon=True)
        follower.start()
        assert attached.wait(20)
        time.sleep(0.5)  # the follower is caught up and waits
        shipped_at = time.monotonic()
        assert ship(a.url, agent, 0, b"shipped to a\n") == 13
        follower.join(10)
        assert "at" in seen, "the follower on B never saw the line"
        assert seen["at"] - shipped_at < 1.0
        assert httpx.get(f"{b.url}/v1/jobs/{job_id}/logs", headers=h).text == "shipped to a\n"
        assert httpx.get(f"{b.url}/v1/jobs/{job_id}/logs", params={"tail": 1}, headers=h).text == \
            "shipped to a\n"
        # Another team sees nothing of it on either replica.
        other = team(b.url, "other")
        assert httpx.get(f"{b.url}/v1/jobs/{job_id}/logs", headers=other).status_code == 404
        httpx.post(f"{a.url}/v1/jobs/{job_id}/cancel", headers=h)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def _get(url: str, path: str, h: dict[str, str], read: bool, hold: asyncio.Event) -> int:
    """A GET on a raw socket (a client that costs little CPU next to the
    server it measures): its body read and counted, or left unread until
    `hold` is set. Returns the bytes read."""
    port = int(url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 f"Authorization: {h['Authorization']}\r\n\r\n".encode())
    assert b" 200 " in await reader.readline()
    read_bytes = 0
    try:
        if not read:
            await hold.wait()
            return 0
        while chunk := await reader.read(1 << 16):
            read_bytes += len(chunk)
        return read_bytes
    finally:
        writer.close()


# Another team's GET /v1/jobs every 50 ms until the stop file exists, from a
# process of its own (sharing the readers' interpreter would time the test's
# own client): the latencies in ms, as JSON on stdout.
PROBE = """
import json, os, sys, time
import httpx
url, auth, stop = sys.argv[1:4]
out = []
with httpx.Client(base_url=url, timeout=30) as c:
    while not os.path.exists(stop):
        started = time.perf_counter()
        assert c.get("/v1/jobs", headers={"Authorization": auth}).status_code == 200
        out.append((time.perf_counter() - started) * 1000)
        time.sleep(0.05)
print(json.dumps(out))
"""


def _p99(latencies: list[float]) -> float:
    latencies = sorted(latencies)
    return latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]


def _probe_alone(url: str, headers: dict[str, str], stop: Path, seconds: float) -> list[float]:
    """The other team's probe, with no log reader running: the machine's own latency now."""
    probe = subprocess.Popen([sys.executable, "-c", PROBE, url, headers["Authorization"], str(stop)],
                             stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(seconds)
    finally:
        stop.touch()
        out, _ = probe.communicate(timeout=60)
    return json.loads(out)


async def _sixteen_readers(url: str, job_id: int, h: dict[str, str], pid: int) -> tuple[float, list[int]]:
    """8 clients read the whole log and 8 follow it without reading, all at
    once: (the broker's peak RSS in MiB, the bytes each reader got)."""
    hold, done = asyncio.Event(), asyncio.Event()
    peak = [_rss_mib(pid)]

    async def sample() -> None:
        while not done.is_set():
            peak.append(_rss_mib(pid))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    idle = [asyncio.create_task(_get(url, f"/v1/jobs/{job_id}/logs?follow=true", h, False, hold)) for _ in range(8)]
    sizes = await asyncio.gather(*[_get(url, f"/v1/jobs/{job_id}/logs", h, True, hold) for _ in range(8)])
    hold.set()
    await asyncio.gather(*idle)
    done.set()
    await sampler
    return max(peak), sizes


def test_sixteen_clients_reading_a_100_mib_log_cost_the_broker_under_64_mib(serve_process, settings, tmp_path):
    """Issue #24: one read of a 100 MiB log took +182 MB, eight followers that
    did not read +1.6 GB, and another team waited up to 1.1 s."""
    with serve_process(SPOTBROKER_MAX_LOG_BYTES=str(200 * MIB)) as server:
        h, other = team(server.url, "big"), team(server.url, "other")
        job_id, agent = running_job(server.url, h, settings)
        line = b"x" * 1023 + b"\n"
        chunk = line * (4 * MIB // len(line))
        offset = 0
        for _ in range(25):
            offset = ship(server.url, agent, offset, chunk)
        assert offset == 100 * MIB
        for _ in range(3):  # ordinary traffic first: the baseline is a broker that has served requests
            httpx.get(f"{server.url}/v1/jobs", headers=other)
        before = _rss_mib(server.proc.pid)
        baseline = _p99(_probe_alone(server.url, other, tmp_path / "stop-baseline", seconds=4))
        stop = tmp_path / "stop-probing"
        probe = subprocess.Popen([sys.executable, "-c", PROBE, server.url, other["Authorization"], str(stop)],
                                 stdout=subprocess.PIPE, text=True)
        try:
            time.sleep(1)  # its interpreter has started
            peak, sizes = asyncio.run(_sixteen_readers(server.url, job_id, h, server.proc.pid))
        finally:
            stop.touch()
            out, _ = probe.communicate(timeout=60)
        latencies = json.loads(out)
        assert all(size > 100 * MIB for size in sizes)  # the whole log, and the response's head
        assert peak - before < 64, f"the broker grew from {before:.0f} to {peak:.0f} MiB"
        p99 = _p99(latencies)
        # The goal is 100 ms (bench/log_store.py measures it: 98 ms). Under the suite's other workers, on
        # the same 2 cores as the 16 clients, the readers may add 150 ms to the same probe's p99 measured
        # just before without them, and more on a slower machine (85 -> 299 ms on one 2.5 times slower),
        # so the bound grows with the baseline. The p99 of ~45 requests is their slowest but one: a
        # loaded machine's scheduler alone once made it 254 ms (21 ms without readers). Reading whole
        # logs into memory cost seconds (1.1 s measured), which the bound still refuses.
        assert p99 <= max(400, 3 * baseline + 250), \
            f"another team's p99 was {p99:.0f} ms over {len(latencies)} requests ({baseline:.0f} ms without readers)"
        httpx.post(f"{server.url}/v1/jobs/{job_id}/cancel", headers=h)


def test_tail_of_a_log_of_long_lines_reads_only_what_it_returns(serve_process, settings):
    """Issue #24: tail=N re-read the end of the file at every step back, in
    time quadratic in how far back its lines began (40 MiB: 17-21 s)."""
    with serve_process() as server:
        h = team(server.url, "ml")
        job_id, agent = running_job(server.url, h, settings)
        offset = ship(server.url, agent, 0, b"short line\n" * (1 << 18))
        for _ in range(8):  # one line of 32 MiB
            offset = ship(server.url, agent, offset, b"z" * (4 * MIB))
        offset = ship(server.url, agent, offset, b"\nend\n")
        started = time.monotonic()
        whole = httpx.get(f"{server.url}/v1/jobs/{job_id}/logs", headers=h, timeout=120)
        read_all = time.monotonic() - started
        started = time.monotonic()
        r = httpx.get(f"{server.url}/v1/jobs/{job_id}/logs", params={"tail": 2}, headers=h, timeout=120)
        took = time.monotonic() - started
        assert r.content == b"z" * (32 * MIB) + b"\nend\n" and whole.content.endswith(r.content)
        # Against the whole log read just before, on the same machine under the same load (a fixed
        # bound failed on a slow machine): tail=2 returns less of it, so it takes about as long or less.
        # The old walk took 17 s and more where the whole log took under one; under the whole suite the
        # two reads' loads differ (4.7 s against 1.6 s once): a margin for that, far below the old walk's.
        assert took < 3 * read_all + 5, f"tail=2 took {took:.1f} s, the whole log {read_all:.1f} s"
        assert httpx.get(f"{server.url}/v1/jobs/{job_id}/logs", params={"tail": 1}, headers=h).text == "end\n"
        assert httpx.get(f"{server.url}/v1/jobs/{job_id}/logs", params={"tail": 0}, headers=h).text == ""
        httpx.post(f"{server.url}/v1/jobs/{job_id}/cancel", headers=h)
