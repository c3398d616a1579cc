"""Notice -> committed for a distributed trainer, against one process.

1 GiB of fp32 state in all, to ``file://`` on this machine's disk, on CPU:

* one process holding it (the single-process figure);
* replicated (DDP) over 2 and 4 ranks: every rank holds the whole 1 GiB,
  rank 0 writes it and every rank its RNG states;
* sharded (``torch.distributed.checkpoint``) over 2 and 4 ranks: each rank
  holds and writes 1/N of it.

"notice" is the moment this script, playing the node's agent, has written
``flush.json`` and signalled every rank of the library (as the agent does);
"committed" is when ``checkpoint_committed`` (reason flush) is in the
control directory's ``events.jsonl``. The ranks step every 10 ms meanwhile,
so the figure includes their agreement on the step. Goal: within 1.3x of
one process. Each figure is the median of ``--repeats`` runs (a fresh run of
the ranks each).

    python bench/distributed_flush.py [--gib 1] [--ranks 2 4] [--repeats 3] [--layouts replicated sharded]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spotbroker.agent import protocol

WORKER = r"""
import os, sys, time, torch, torch.distributed as dist
from torch import nn
from spotbroker.agent.checkpoint import Checkpointer
gib, sharded = float(sys.argv[1]), sys.argv[2] == "sharded"
world = int(os.environ.get("WORLD_SIZE", "1"))
if world > 1:
    dist.init_process_group("gloo")
rank = int(os.environ.get("RANK", "0"))
chunk = 16 * 1024 * 1024  # 64 MiB of fp32 per parameter
total = int(gib * 1024**3 / 4) // (world if sharded else 1)
params = nn.ParameterDict({f"r{rank if sharded else 0}_{i}": nn.Parameter(torch.rand(min(chunk, total - i * chunk)))
                           for i in range(-(-total // chunk))})
ckpt = Checkpointer(params, uri=sys.argv[3], every_seconds=None, sharded=sharded)
print("ready", flush=True)
step = 0
while not os.path.exists(sys.argv[4]):
    step += 1
    ckpt.step(step)
    time.sleep(0.01)
ckpt.close()
"""


def one_run(mode: str, ranks: int, gib: float) -> float:
    with tempfile.TemporaryDirectory(prefix="dist-flush-", dir=os.environ.get("BENCH_DIR")) as tmp:
        control, done = Path(tmp) / "control", Path(tmp) / "done"
        control.mkdir()
        env = {**os.environ, protocol.ENV_CONTROL_DIR: str(control), "OMP_NUM_THREADS": "1"}
        args = [str(gib), mode, f"file://{tmp}/ckpt", str(done)]
        script = Path(tmp) / "worker.py"
        script.write_text(WORKER)
        if ranks == 1:
            command = [sys.executable, str(script), *args]
        else:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
                       str(script), *args]
        errors = Path(tmp) / "ranks.log"
        with errors.open("wb") as err:
            proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                                    start_new_session=True)
        try:
            for _ in range(ranks):
                if proc.stdout.readline().strip() != "ready":
                    proc.wait(60)
                    raise RuntimeError(f"a rank did not start: {errors.read_text()[-2000:]}")
            while len(list(control.glob("library-*.json"))) < ranks:
                time.sleep(0.01)
            time.sleep(1.0)  # all ranks stepping
            pids = [json.loads(p.read_text())["pid"] for p in control.glob("library-*.json")]
            (control / protocol.FLUSH_FILE).write_text(json.dumps({"deadline": "", "reason": "bench"}))
            notice = time.monotonic()
            for pid in pids:
                os.kill(pid, signal.SIGUSR1)
            events = control / protocol.EVENTS_FILE
            while True:
                lines = events.read_text().splitlines() if events.exists() else []
                if any('"checkpoint_committed"' in line and '"flush"' in line for line in lines):
                    return time.monotonic() - notice
                if proc.poll() is not None:
                    raise RuntimeError(f"the ranks exited ({proc.returncode}) before the commit")
                time.sleep(0.002)
        finally:
            done.touch()
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--layouts", nargs="+", choices=["replicated", "sharded"], default=["replicated", "sharded"])
    args = p.parse_args()

    def median(mode: str, ranks: int) -> float:
        return statistics.median(one_run(mode, ranks, args.gib) for _ in range(args.repeats))

    single = median("replicated", 1)
    print(f"{args.gib:g} GiB of state to file://, notice -> committed (median of {args.repeats})")
    print(f"{'layout':<12}{'ranks':>6}{'seconds':>10}{'vs one process':>16}   goal <= 1.3x")
    print(f"{'one process':<12}{1:>6}{single:>10.2f}{1.0:>15.2f}x")
    for mode in args.layouts:
        for ranks in args.ranks:
            seconds = median(mode, ranks)
            print(f"{mode:<12}{ranks:>6}{seconds:>10.2f}{seconds / single:>15.2f}x", flush=True)


if __name__ == "__main__":
    main()
