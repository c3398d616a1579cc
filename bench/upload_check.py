"""What a hostile upload costs a real `spotbroker serve` process: the
quota's check, the archive's check (read as a stream, never unpacked), and
another team's latency meanwhile.

1. A team over its quota sends a 255 KB archive of one 250 MiB file of
   zeros: seconds to its 413 (declared Content-Length; then chunked, so
   the body is read and hashed first).
2. A team within its quota sends the same archive, and one of 99,990 empty
   files: seconds to its 201 (the check reads every header; nothing is
   written but the archive itself), and the broker's /tmp at its fullest.
3. Six uploads of the 99,990-file archive at once, while a third team's
   `GET /v1/jobs` is timed every 50 ms: its p50 and p99, and the same
   without uploads.

    python bench/upload_check.py                 # SQLite
    python bench/upload_check.py --db postgresql
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import shutil
import statistics
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import httpx
from _db import temporary_database
from api_hostile import Broker

QUOTA = 8 * 1024 * 1024


def bomb() -> bytes:
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9) as gz, tarfile.open(fileobj=gz, mode="w|") as tar:
        info = tarfile.TarInfo("zeros")
        info.size = 250 * 1024 * 1024
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    return raw.getvalue()


def empty_files(n: int = 99_990) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for i in range(n):
            tar.addfile(tarfile.TarInfo(f"d{i // 1000}/f{i}"))
    return raw.getvalue()


def put(url: str, token: str, body: bytes, chunked: bool = False) -> tuple[int, float]:
    sha = hashlib.sha256(body).hexdigest()
    content = iter([body]) if chunked else body
    start = time.perf_counter()
    r = httpx.put(f"{url}/v1/uploads/{sha}", content=content, timeout=300,
                  headers={"Authorization": f"Bearer {token}", "Content-Type": "application/gzip"})
    return r.status_code, time.perf_counter() - start


def tmp_watch(stop: threading.Event, peak: list[int]) -> None:
    """The most bytes the broker's upload files held in /tmp at any look."""
    tmp = Path(tempfile.gettempdir())
    while not stop.is_set():
        total = 0
        for p in tmp.glob("spotbroker-upload*"):
            try:
                total += sum(f.stat().st_size for f in p.rglob("*")) if p.is_dir() else p.stat().st_size
            except OSError:
                pass
        peak[0] = max(peak[0], total)
        time.sleep(0.01)


def latency(url: str, token: str, seconds: float) -> list[float]:
    out, end = [], time.monotonic() + seconds
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        while time.monotonic() < end:
            start = time.perf_counter()
            c.get(f"{url}/v1/jobs")
            out.append((time.perf_counter() - start) * 1000)
            time.sleep(0.05)
    return out


def p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spotbroker-bench-"))
    url, drop = temporary_database(args.db, work)
    broker = Broker(url, work / "data", SPOTBROKER_UPLOAD_QUOTA_BYTES=str(QUOTA))
    try:
        full, within, other = broker.team("full"), broker.team("within"), broker.team("other")
        filler = io.BytesIO()
        with tarfile.open(fileobj=filler, mode="w:gz") as tar:
            info = tarfile.TarInfo("random")
            info.size = QUOTA - 64 * 1024
            tar.addfile(info, io.BytesIO(os.urandom(info.size)))
        assert put(broker.url, full, filler.getvalue())[0] == 201
        b, many = bomb(), empty_files()
        print(f"archives: zeros {len(b) / 1024:.0f} KB (250 MiB unpacked), "
              f"99,990 empty files {len(many) / 1024:.0f} KB")
        for chunked in (False, True):
            runs = [put(broker.url, full, b, chunked) for _ in range(5)]
            assert {code for code, _ in runs} == {413}, runs
            print(f"over quota, {'chunked ' if chunked else 'declared'}: 413 in median "
                  f"{statistics.median(s for _, s in runs) * 1000:.0f} ms")
        stop, peak = threading.Event(), [0]
        watcher = threading.Thread(target=tmp_watch, args=(stop, peak), daemon=True)
        watcher.start()
        for name, body in (("zeros", b), ("99,990 empty files", many)):
            runs = [put(broker.url, within, body) for _ in range(3)]
            assert {code for code, _ in runs} == {201}, runs
            print(f"within quota, {name}: 201 in median {statistics.median(s for _, s in runs):.2f} s")
        stop.set()
        watcher.join()
        print(f"the broker's upload files in /tmp at their fullest: {peak[0] / 1024:.0f} KB")
        quiet = latency(broker.url, other, 10)
        print(f"another team's GET /v1/jobs, no uploads: p50 {p(quiet, .5):.1f} ms, p99 {p(quiet, .99):.1f} ms "
              f"({len(quiet)} requests)")
        results: list[tuple[int, float]] = []
        uploads = [threading.Thread(target=lambda: results.append(put(broker.url, within, many))) for _ in range(6)]
        for t in uploads:
            t.start()
        busy = latency(broker.url, other, 10)
        for t in uploads:
            t.join()
        print(f"another team's GET /v1/jobs, six 99,990-file uploads at once: p50 {p(busy, .5):.1f} ms, "
              f"p99 {p(busy, .99):.1f} ms ({len(busy)} requests); the uploads took "
              f"{max(s for _, s in results):.1f} s at most, answers {sorted(c for c, _ in results)}")
    finally:
        broker.stop()
        drop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
