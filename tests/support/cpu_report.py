"""What each test costs in CPU: `SPOTBROKER_TEST_CPU=FILE make test` appends
one line per test to FILE, `seconds nodeid`: the CPU of its worker and of the
processes the worker waited for (the servers, agents and jobs it started and
stopped), setup and teardown included. On a machine whose cores are all busy
a test's wall time says more about its neighbours than about it; its CPU is
what the suite's run time is made of. Processes that outlive the test
(SkyPilot's API server, PostgreSQL) are not counted.

    sort -rn FILE | head            # the costliest tests
    python -m support.cpu_report FILE  # per file, costliest first
"""
from __future__ import annotations

import os
import sys
from collections import defaultdict

import pytest

ENV = "SPOTBROKER_TEST_CPU"


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    path = os.environ.get(ENV)
    if not path:
        yield
        return
    started = _cpu()
    yield
    line = f"{_cpu() - started:.2f} {item.nodeid}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)  # one write per line: the workers append to one file
    finally:
        os.close(fd)


def per_file(path: str) -> list[tuple[float, int, str]]:
    seconds: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for line in open(path):
        cpu, nodeid = line.split(" ", 1)
        file = nodeid.split("::")[0]
        seconds[file] += float(cpu)
        count[file] += 1
    return sorted(((s, count[f], f) for f, s in seconds.items()), reverse=True)


if __name__ == "__main__":
    rows = per_file(sys.argv[1])
    print(f"{sum(r[0] for r in rows):.0f} s of CPU in {sum(r[1] for r in rows)} tests")
    for seconds, tests, file in rows:
        print(f"{seconds:8.1f} s {tests:4d} tests  {file}")
