"""A team cannot starve the broker with task files: SkyPilot YAML is parsed
in pure Python holding the GIL (seconds a megabyte), so only a few are
parsed at once; the others wait their turn without a thread."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from spotbroker.broker.jobs import taskyaml

YAML_PARSES = 2  # spotbroker.api.routers.jobs.YAML_PARSES


def test_task_files_are_parsed_a_few_at_a_time(api, team_headers, monkeypatch):
    h = {**team_headers("ml"), "Content-Type": "application/yaml"}
    real, lock = taskyaml.parse_warned, threading.Lock()
    now = peak = 0

    def slow_parse(data: bytes):
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)
        time.sleep(0.3)
        with lock:
            now -= 1
        return real(data)

    monkeypatch.setattr(taskyaml, "parse_warned", slow_parse)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: api.post("/v1/jobs", content=f"name: j{i}\nrun: 'true'\n", headers=h),
                                range(8)))
    assert [r.status_code for r in answers] == [201] * 8
    assert 1 <= peak <= YAML_PARSES
