"""Fixtures of the API tests: `spotbroker serve` as its own process, for
what a server in a test's own thread cannot show: signals (SIGTERM), the
process's whole log output."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from support.helpers import stop_local_nodes
from support.ports import free_port


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def _serve_process(db_url: str, data_dir: Path, admin_token: str, log_level: str = "info",
                  **env: str) -> Iterator[ServerProcess]:
    port = free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir.parent / f"server-{port}.log"
    environ = {**os.environ, "SPOTBROKER_DATABASE_URL": db_url, "SPOTBROKER_DATA_DIR": str(data_dir),
               "SPOTBROKER_ADMIN_TOKEN": admin_token, "SPOTBROKER_PORT": str(port),
               "SPOTBROKER_SECRET_KEY": "test-signing-key", "SPOTBROKER_RECONCILE_INTERVAL": "0.1",
               "SPOTBROKER_LOCAL_KILL_GRACE_SECONDS": "2", "SPOTBROKER_LOCAL_MAX_RUNNING": "8",
               "PYTHONUNBUFFERED": "1", "SPOTBROKER_PRELOAD_SKYPILOT": "false", **env}
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "spotbroker.broker.cli", "serve", "--log-level", log_level],
                                stdout=out, stderr=subprocess.STDOUT, env=environ)
    server = ServerProcess(proc, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"the server exited: {server.output()}"
            try:
                if httpx.get(server.url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"the server did not start: {server.output()}"
            time.sleep(0.1)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def serve_process(db_url, data_dir):
    """`with serve_process(**env) as server:` a server on the test's database
    and data directory (`disk=`: a replica with a data directory of its
    own); every local node they started is stopped after."""
    from conftest import ADMIN_TOKEN

    disks = {data_dir}

    def start(log_level: str = "info", disk: Path | None = None, **env: str):
        disks.add(disk or data_dir)
        return _serve_process(db_url, disk or data_dir, ADMIN_TOKEN, log_level, **env)

    yield start
    for disk in disks:
        stop_local_nodes(disk)


@pytest.fixture
def server(serve_process) -> Iterator[ServerProcess]:
    with serve_process() as proc:
        yield proc
