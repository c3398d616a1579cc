"""What each test costs in CPU, and when it ran: `SPOTBROKER_TEST_CPU=FILE
make test` appends one line per test to FILE, tab-separated: its CPU seconds,
the xdist worker, its start and end (Unix time), its nodeid. The CPU is its
worker's and that of the processes the worker waited for (the servers, agents
and jobs it started and stopped), setup and teardown included. On a machine
whose cores are all busy a test's wall time says more about its neighbours
than about it; its CPU is what the suite's run time is made of. Processes
that outlive the test (SkyPilot's API server, PostgreSQL) are not counted.

    sort -rn FILE | head                          # the costliest tests
    python -m support.cpu_report FILE             # per file, costliest first
    python -m support.cpu_report --timeline FILE  # per minute: workers busy, CPU used
"""
from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from typing import NamedTuple

import pytest

ENV = "SPOTBROKER_TEST_CPU"


class Line(NamedTuple):
    cpu: float
    worker: str
    start: float
    end: float
    nodeid: str


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    path = os.environ.get(ENV)
    if not path:
        yield
        return
    started, start = _cpu(), time.time()
    yield
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = f"{_cpu() - started:.2f}\t{worker}\t{start:.2f}\t{time.time():.2f}\t{item.nodeid}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)  # one write per line: the workers append to one file
    finally:
        os.close(fd)


def read(path: str) -> list[Line]:
    lines = []
    for text in open(path):
        cpu, worker, start, end, nodeid = text.rstrip("\n").split("\t", 4)
        lines.append(Line(float(cpu), worker, float(start), float(end), nodeid))
    return lines


def per_file(lines: list[Line]) -> list[tuple[float, int, str]]:
    seconds: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for line in lines:
        file = line.nodeid.split("::")[0]
        seconds[file] += line.cpu
        count[file] += 1
    return sorted(((s, count[f], f) for f, s in seconds.items()), reverse=True)


def timeline(lines: list[Line], bucket: float = 60.0) -> list[tuple[float, float, float]]:
    """Per `bucket` seconds from the first test's start: (minute, workers busy on
    average, CPU seconds per second). A test's CPU is spread evenly over its wall
    time, so a minute's figure is an estimate; the tail of a run (fewer workers
    than cores busy) is what it shows plainly."""
    t0 = min(line.start for line in lines)
    n = int((max(line.end for line in lines) - t0) // bucket) + 1
    busy, cpu = [0.0] * n, [0.0] * n
    for line in lines:
        a, b = line.start - t0, line.end - t0
        rate = line.cpu / (b - a) if b > a else 0.0
        for i in range(int(a // bucket), int(b // bucket) + 1):
            overlap = min(b, (i + 1) * bucket) - max(a, i * bucket)
            if overlap > 0:
                busy[i] += overlap / bucket
                cpu[i] += rate * overlap / bucket
    return [(i * bucket / 60, busy[i], cpu[i]) for i in range(n)]


def main(argv: list[str]) -> None:
    lines = read(argv[-1])
    if argv[0] == "--timeline":
        ends = defaultdict(float)
        for line in lines:
            ends[line.worker] = max(ends[line.worker], line.end)
        t0 = min(line.start for line in lines)
        print("worker  last test ended (s after the first began)")
        for worker, end in sorted(ends.items(), key=lambda kv: kv[1]):
            print(f"{worker:7s} {end - t0:7.0f}")
        print(" minute  workers busy  CPU s/s")
        for minute, busy, cpu in timeline(lines):
            print(f"{minute:7.0f}  {busy:12.2f}  {cpu:7.2f}")
        return
    rows = per_file(lines)
    print(f"{sum(r[0] for r in rows):.0f} s of CPU in {sum(r[1] for r in rows)} tests")
    for seconds, tests, file in rows:
        print(f"{seconds:8.1f} s {tests:4d} tests  {file}")


if __name__ == "__main__":
    main(sys.argv[1:])
