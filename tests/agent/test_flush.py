"""Which processes the agent asks to flush: every one that announced the
library below the trainer, whatever its session; never one outside."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spotbroker.agent import proctree
from spotbroker.agent.checkpoint.control import write_library_file
from spotbroker.agent.flush import library_pids, request_flush

# A "torchrun": starts two workers, each in a session of its own (as torchrun
# does), and prints their pids.
LAUNCHER = """
import subprocess, sys, time
workers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
           for _ in range(2)]
print(" ".join(str(w.pid) for w in workers), flush=True)
time.sleep(60)
"""


@pytest.fixture
def trainer():
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    workers = [int(p) for p in proc.stdout.readline().split()]
    yield proc, workers
    proctree.kill_tree(proc.pid)
    proc.wait()


@pytest.fixture
def outsider():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def announce(control: Path, pid: int, start: str | None = "live") -> None:
    start = proctree.start_time(pid) if start == "live" else start
    (control / f"library-{pid}.json").write_text(json.dumps({"pid": pid, "start": start, "version": 2}))


def test_workers_in_their_own_sessions_are_asked_and_an_outsider_never(tmp_path, trainer, outsider):
    proc, workers = trainer
    assert all(os.getsid(w) == w for w in workers)  # not in the trainer's session nor group
    for pid in (*workers, outsider.pid):
        announce(tmp_path, pid)
    assert sorted(library_pids(tmp_path, proc.pid)) == sorted(workers)


def test_a_pid_whose_start_time_differs_is_a_reused_pid_and_never_asked(tmp_path, trainer):
    proc, workers = trainer
    announce(tmp_path, workers[0], start="12345")
    announce(tmp_path, workers[1])
    assert library_pids(tmp_path, proc.pid) == [workers[1]]


def test_the_library_announces_each_process_and_the_first_rank_also_for_older_agents(tmp_path):
    write_library_file(tmp_path, rank=3, local_rank=1)
    mine = json.loads((tmp_path / f"library-{os.getpid()}.json").read_text())
    assert (mine["pid"], mine["rank"], mine["local_rank"]) == (os.getpid(), 3, 1)
    assert mine["start"] == proctree.start_time(os.getpid())
    assert not (tmp_path / "library.json").exists()  # only local rank 0 writes the old file
    write_library_file(tmp_path)
    assert json.loads((tmp_path / "library.json").read_text())["pid"] == os.getpid()


def test_every_worker_gets_the_signal_after_flush_json_is_written(tmp_path):
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGUSR1, lambda *a: (print('flush', flush=True), sys.exit(0)))\n"
              "print('ready', flush=True)\ntime.sleep(30)\n")
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              start_new_session=True) for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        signalled = request_flush(tmp_path, [p.pid for p in procs], datetime.now(UTC), "notice")
        assert sorted(signalled) == sorted(p.pid for p in procs)
        assert json.loads((tmp_path / "flush.json").read_text())["reason"] == "notice"
        deadline = time.monotonic() + 10
        for p in procs:
            assert p.wait(max(0.1, deadline - time.monotonic())) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
