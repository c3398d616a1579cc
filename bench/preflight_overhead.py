"""What a CPU pre-flight adds before a GPU is rented, for examples/train.py.

1. The library alone: `python examples/train.py` under SPOTBROKER_PREFLIGHT=1
   (and CUDA_VISIBLE_DEVICES=""), as the pre-flight's node runs it: the
   interpreter and torch starting, 2 steps, one save to the node's disk and
   its restore into fresh objects, exit 0. Wall time per run.
2. Through a real `spotbroker serve` (embedded defaults, local launcher), a
   job asking for a spot T4 with `preflight: true` and the same job without:
   from submission to the GPU attempt's launch (its `LAUNCHING` event). The
   difference is the pre-flight's overhead on the job's wall time, given as
   a share of a 1-hour run; and what the pre-flight cost against an hour of
   the GPU (the simulated places' catalog prices).

    python bench/preflight_overhead.py [--runs 5]
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from preemption_timeline import TERMINAL, start_broker, wait

from spotbroker.broker.cli.client import Client
from spotbroker.broker.cli.demo import TRAIN

ARGS = "--steps 200 --seed 1 --every-steps 1000 --log-every 0"


def imports_alone(runs: int) -> list[float]:
    """The part of (1) that is the interpreter and torch starting."""
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch, spotbroker.agent.checkpoint"], check=True, timeout=300)
        times.append(time.perf_counter() - began)
    return times


def library_alone(runs: int, scratch: Path) -> list[float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    env.update(SPOTBROKER_PREFLIGHT="1", CUDA_VISIBLE_DEVICES="", CHECKPOINT_URI=(scratch / "ckpt").as_uri(),
               TMPDIR=str(scratch))
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        done = subprocess.run([sys.executable, str(TRAIN), *shlex.split(ARGS)], env=env, capture_output=True,
                              text=True, timeout=300)
        times.append(time.perf_counter() - began)
        if done.returncode != 0 or "pre-flight passed" not in done.stdout:
            raise SystemExit(f"the pre-flight did not pass:\n{done.stdout}\n{done.stderr}")
    return times


def to_gpu_launch(c: Client, preflight: bool) -> dict[str, float]:
    """Seconds from submission to the GPU attempt's launch; the pre-flight's own figures."""
    spec = {"name": "bench", "run": f"python {shlex.quote(str(TRAIN))} {ARGS}",
            "resources": {"accelerators": "T4:1", "use_spot": True}}
    if preflight:
        spec["preflight"] = True
    job = c.submit(spec)
    job = wait(c, job["id"], lambda j: j["state"] in TERMINAL, "the end")
    if job["state"] != "SUCCEEDED":
        raise SystemExit(f"job {job['id']} ended {job['state']} ({job.get('reason')})")
    events = c.events(job["id"])
    gpu = next(a for a in job["attempts"] if not a["preflight"])
    launched = next(e for e in events if e["type"] == "job_state" and e["data"]["to"] == "LAUNCHING"
                    and e["data"]["attempt_id"] == gpu["id"])
    out = {"to_gpu": (datetime.fromisoformat(launched["at"]) - datetime.fromisoformat(job["created_at"]))
           .total_seconds(), "gpu_price": gpu["price_per_hour"]}
    if preflight:
        passed = next(e["data"] for e in events if e["type"] == "preflight_passed")
        out.update(preflight_s=passed["seconds"], preflight_cost=passed["cost"], cpu=passed["instance_type"],
                   cpu_price=passed["price_per_hour"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    opts = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="spotbroker-bench-"))
    base.chmod(0o711)  # as root, jobs run as a user who must enter the data dir
    (base / "data").mkdir()
    (base / "scratch").mkdir()
    alone = library_alone(opts.runs, base / "scratch")
    print(f"library alone (train.py, 2 steps + save + restore, exit 0): median {statistics.median(alone):.2f} s "
          f"(min {min(alone):.2f}, max {max(alone):.2f}, {opts.runs} runs); of which the interpreter and "
          f"torch starting: {statistics.median(imports_alone(opts.runs)):.2f} s")
    server, url, token = start_broker(base / "data")
    try:
        with Client(url, token) as c:
            rows = {True: [], False: []}
            for _ in range(opts.runs):
                for flag in (False, True):
                    rows[flag].append(to_gpu_launch(c, flag))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)
    without = statistics.median(r["to_gpu"] for r in rows[False])
    with_pf = statistics.median(r["to_gpu"] for r in rows[True])
    flight = rows[True][0]
    print(f"submission -> GPU launch: {without:.2f} s without a pre-flight, {with_pf:.2f} s with (medians of "
          f"{opts.runs})")
    overhead = with_pf - without
    print(f"pre-flight overhead: {overhead:.2f} s = {100 * overhead / 3600:.2f} % of a 1-hour run")
    pf_s = statistics.median(r["preflight_s"] for r in rows[True])
    pf_cost = statistics.median(r["preflight_cost"] for r in rows[True])
    print(f"the pre-flight attempt itself: {pf_s:.2f} s on {flight['cpu']} (${flight['cpu_price']:.4f}/h), "
          f"${pf_cost:.6f}; an hour of the GPU (T4 spot): ${flight['gpu_price']:.4f}")


if __name__ == "__main__":
    main()
