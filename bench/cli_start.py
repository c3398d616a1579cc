"""What one client command costs, as a user's shell runs it: `spotbroker
jobs`, `job N`, `logs N`, `costs` and `teams list` against a running broker
(`spotbroker serve` on a fresh embedded database, one team, one finished
job), each a new process. Prints, per command, the median wall seconds and
CPU seconds (user + system, from the kernel's count for the finished child)
over the rounds.

    python bench/cli_start.py [--rounds 7]
"""
from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ADMIN = "bench-admin-token-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one command, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert r.returncode == 0, r.stderr
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="cli-start-"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    env.update(HOME=str(home), SPOTBROKER_ADMIN_TOKEN=ADMIN)
    server = subprocess.Popen([sys.executable, "-m", "spotbroker.broker.cli", "serve", "--port", str(port),
                               "--log-level", "warning"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, cwd=home)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the broker did not start"
            time.sleep(0.2)
        admin = {"Authorization": f"Bearer {ADMIN}"}
        token = httpx.post(f"{url}/v1/teams", json={"name": "bench"}, headers=admin).json()["token"]
        team = {"Authorization": f"Bearer {token}"}
        job = httpx.post(f"{url}/v1/jobs", json={"name": "hello", "run": "echo hello",
                                                 "resources": {"infra": "local"}}, headers=team).json()["id"]
        while httpx.get(f"{url}/v1/jobs/{job}", headers=team).json()["state"] not in ("SUCCEEDED", "FAILED"):
            time.sleep(0.2)
        shell = {**{k: v for k, v in env.items() if k != "SPOTBROKER_ADMIN_TOKEN"},
                 "SPOTBROKER_URL": url, "SPOTBROKER_TOKEN": token}
        commands = {"jobs": ["jobs"], "job N": ["job", str(job)], "logs N": ["logs", str(job)],
                    "costs": ["costs"], "teams list": ["teams", "list"]}
        print(f"{'command':<12} {'wall s':>7} {'CPU s':>7}   (median of {args.rounds})")
        for name, argv in commands.items():
            run_env = {**shell, "SPOTBROKER_ADMIN_TOKEN": ADMIN} if name == "teams list" else shell
            samples = [timed([sys.executable, "-m", "spotbroker.broker.cli", *argv], run_env)
                       for _ in range(args.rounds)]
            print(f"{name:<12} {statistics.median(s[0] for s in samples):7.3f} "
                  f"{statistics.median(s[1] for s in samples):7.3f}")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
