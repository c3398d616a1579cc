"""The first `spotbroker submit` against a fresh broker, as a new user runs
it (issue #25: 5.3 s with no output): `spotbroker serve` on the embedded
default (a new HOME: new database, new key), `spotbroker teams create`, then
`spotbroker submit task.yaml` of a small workdir (20 files, 60 KB), timed
from outside as wall seconds, and a second submit for comparison. With
SkyPilot imported at the first task file (SPOTBROKER_PRELOAD_SKYPILOT=false,
as before) and in the background once the server has started (the default).

    python bench/first_submit.py [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

CLI = [sys.executable, "-m", "spotbroker.broker.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    started = time.perf_counter()
    r = subprocess.run(CLI + args, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"spotbroker {' '.join(args)} failed: {r.stderr}")
    return time.perf_counter() - started, r.stdout


def one_round(preload: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "wd").mkdir()
        for i in range(20):
            (root / "wd" / f"f{i}.py").write_text(f"# file {i}\n" + "x = 1\n" * 500)
        (root / "task.yaml").write_text("name: small\nworkdir: wd\nrun: ls\n")
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
        env.update(HOME=str(root / "home"), SPOTBROKER_PORT=str(port),
                   SPOTBROKER_PRELOAD_SKYPILOT="true" if preload else "false")
        started = time.perf_counter()
        server = subprocess.Popen(CLI + ["serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            while True:
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.perf_counter() - started > 120:
                    raise SystemExit("the server did not start")
                time.sleep(0.05)
            ready = time.perf_counter() - started
            _, out = timed(["teams", "create", "t1"], env, root)
            env.update(SPOTBROKER_URL=url, SPOTBROKER_TOKEN=out.strip().splitlines()[-1])
            first, _ = timed(["submit", "task.yaml"], env, root)
            second, _ = timed(["submit", "task.yaml"], env, root)
            jobs, _ = timed(["jobs"], env, root)
        finally:
            server.terminate()
            server.wait(30)
    return {"serve ready": ready, "first submit": first, "second submit": second, "jobs (CLI start)": jobs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}, {args.rounds} rounds, median seconds")
    for preload, label in ((False, "SkyPilot imported at the first task file (before)"),
                           (True, "SkyPilot preloaded in the background (after)")):
        rounds = [one_round(preload) for _ in range(args.rounds)]
        print(label)
        for key in rounds[0]:
            values = [r[key] for r in rounds]
            print(f"  {key:18s} {statistics.median(values):6.2f}  (min {min(values):.2f}, max {max(values):.2f})")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
