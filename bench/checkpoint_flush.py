"""Checkpoint flush and periodic-save figures for the checkpoint library.

Measured in one run:

1. notice -> checkpoint committed, for model + AdamW state of each size in
   ``--s3-sizes-gb`` to S3 (moto's server on loopback, in its own process),
   against the naive way: ``torch.save(state, tmpfile)`` then boto3
   ``upload_file`` with default settings (the classic transfer client, since
   the CRT one ignores ``endpoint_url``). Goal: >= 2x faster.
2. The same to ``file://`` for each size in ``--file-sizes-gb``, against
   ``dd if=/dev/zero bs=16M conv=fsync`` of the same bytes into the same
   directory. Goal: within 1.3x of dd.
3. The training stall of a periodic save (``--stall-gb`` state) against a
   synchronous ``torch.save`` of the same state. Goal: <= 15 %.

"notice" is the moment the flush signal is sent; the trainer is at a step
boundary right after, so the figure is the library's own cost. Sizes are in
GiB of state (parameters plus AdamW's two moments). Run small with
``--s3-sizes-gb 0.25 --file-sizes-gb 0.25 --stall-gb 0.25``.

    python bench/checkpoint_flush.py                   # the figures of docs/benchmarks.md
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from spotbroker.agent import protocol
from spotbroker.agent.checkpoint import Checkpointer
from spotbroker.agent.checkpoint.options import DEFAULT_PART_BYTES, DEFAULT_WORKERS

GIB = 1024**3
CHUNK_PARAMS = 16 * 1024 * 1024  # one 64 MiB fp32 parameter per chunk, like a large layer
BUCKET = "bench"


@dataclass
class Row:
    target: str
    gib: float
    ours: float
    baseline_name: str
    baseline: float
    goal: str

    def line(self) -> str:
        ratio = self.baseline / self.ours if self.target == "s3" else self.ours / self.baseline
        what = f"{ratio:.2f}x faster" if self.target == "s3" else f"{ratio:.2f}x dd's time"
        met = ratio >= 2.0 if self.target == "s3" else ratio <= 1.3
        return (f"{self.target:<5} {self.gib:>6.2f} GiB  {self.ours:>8.2f} s  {self.baseline_name:<28}"
                f"{self.baseline:>8.2f} s  {what:<16} {self.goal:<10} {'met' if met else 'MISSED'}")


def report(target: str, model: Any, optimizer: Any, ours: list[float], baseline_name: str, short: str,
           baseline: list[float], goal: str) -> Row:
    """The medians of interleaved runs as a row; every run and the row printed as they come."""
    row = Row(target, state_bytes(model, optimizer) / GIB, statistics.median(ours), baseline_name,
              statistics.median(baseline), goal)
    print(f"  runs: ours {' '.join(f'{x:.2f}' for x in ours)} | {short} {' '.join(f'{x:.2f}' for x in baseline)}",
          flush=True)
    print(row.line(), flush=True)
    return row


# --------------------------------------------------------------------------
# A model whose state (parameters + AdamW moments) has a given size


def make_state(gib: float, device: str, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    element = torch.tensor([], dtype=dtype).element_size()
    params = int(gib * GIB / (3 * element))  # weights + two moments of the same dtype
    chunks = []
    while params > 0:
        n = min(CHUNK_PARAMS, params)
        chunks.append(torch.nn.Parameter(torch.empty(n, device=device, dtype=dtype).uniform_(-1, 1)))
        params -= n
    model = torch.nn.ParameterList(chunks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.empty_like(p).uniform_(-1e-3, 1e-3)
    optimizer.step()  # fills the two moments
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for s in optimizer.state.values():
        total += sum(v.numel() * v.element_size() for v in s.values() if isinstance(v, torch.Tensor))
    return total


def flush_seconds(model: torch.nn.Module, optimizer: torch.optim.Optimizer, uri: str, control: Path,
                  args: argparse.Namespace) -> tuple[float, int]:
    """Send ourselves the agent's flush signal at a step boundary; seconds until committed."""
    ckpt = Checkpointer(model, optimizer, uri=uri, control_dir=control, every_seconds=None,
                        part_bytes=args.part_bytes, max_workers=args.workers)
    if args.prepared:  # as in training: a step with nothing due makes the host buffer in the background
        ckpt.step(0)
        if ckpt._uploader.host_preparing is not None:
            ckpt._uploader.host_preparing.join()
    os.sync()  # earlier phases' dirty pages must not drain into this measurement
    began = time.perf_counter()
    (control / protocol.FLUSH_FILE).write_text(json.dumps({"reason": "bench"}))
    os.kill(os.getpid(), getattr(signal, protocol.FLUSH_SIGNAL))
    ckpt.step(1)
    seconds = time.perf_counter() - began
    ckpt.close()
    info = ckpt.last_committed
    assert info is not None and info.step == 1, "the flush did not commit"
    return seconds, info.bytes


# --------------------------------------------------------------------------
# S3 on moto, in its own process so that it does not share our interpreter


class Moto:
    def __init__(self) -> None:
        code = ("from moto.server import ThreadedMotoServer\n"
                "import time\n"
                "s = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False)\n"
                "s.start()\n"
                "print('%s:%d' % s.get_host_and_port(), flush=True)\n"
                "while True: time.sleep(3600)\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.endpoint = "http://" + self.proc.stdout.readline().strip()
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "bench",
                    "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"}
        os.environ.update(self.env)
        os.environ.pop("AWS_ENDPOINT_URL_S3", None)

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")

    def reset(self) -> None:
        """Forget every object (moto keeps them in memory) and recreate the bucket."""
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")).read()
        self.client().create_bucket(Bucket=BUCKET)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def naive_s3_seconds(model: torch.nn.Module, optimizer: torch.optim.Optimizer, moto: Moto, scratch: Path) -> float:
    from boto3.s3.transfer import TransferConfig

    path = scratch / "naive.pt"
    client = moto.client()
    os.sync()
    began = time.perf_counter()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    client.upload_file(str(path), BUCKET, "naive/state.pt",
                       Config=TransferConfig(preferred_transfer_client="classic"))
    seconds = time.perf_counter() - began
    path.unlink()
    return seconds


def dd_seconds(nbytes: int, directory: Path) -> float:
    target = directory / "dd.bin"
    count = -(-nbytes // (16 * 1024 * 1024))
    os.sync()
    began = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=16M", f"count={count}", "conv=fsync"],
                   check=True, capture_output=True)
    seconds = time.perf_counter() - began
    target.unlink()
    return seconds


def drop(*objects: Any) -> None:
    del objects
    gc.collect()


# --------------------------------------------------------------------------
# The training stall of a periodic save


def sync_save_seconds(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> float:
    os.sync()
    began = time.perf_counter()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    seconds = time.perf_counter() - began
    path.unlink()
    return seconds


def stall_figures(gib: float, args: argparse.Namespace, scratch: Path) -> list[str]:
    """Rounds of one synchronous torch.save then one periodic save, interleaved
    so that both see the same moods of a shared machine; medians of each."""
    model, optimizer = make_state(gib, args.device, args.dtype)
    nbytes = state_bytes(model, optimizer)
    ckpt = Checkpointer(model, optimizer, uri=f"file://{scratch}/periodic", every_steps=2, every_seconds=None,
                        keep_last=1, part_bytes=args.part_bytes, max_workers=args.workers)
    ckpt.step(1)  # no save due: the host buffer is made in the background, as while training
    if ckpt._uploader.host_preparing is not None:
        ckpt._uploader.host_preparing.join()
    syncs, stalls, uploads = [], [], []
    for step in range(2, 2 + 2 * args.stall_repeat, 2):
        syncs.append(sync_save_seconds(model, optimizer, scratch / "sync.pt"))
        ckpt.step(step - 1)  # nothing due
        os.sync()
        began = time.perf_counter()
        ckpt.step(step)  # a periodic save: snapshot, then upload in the background
        stalls.append(time.perf_counter() - began)
        info = ckpt.wait()  # isolate each save: the next one measures the stall alone
        assert info is not None and info.step == step
        uploads.append(info.seconds or 0.0)
    ckpt.close()
    shutil.rmtree(scratch / "periodic", ignore_errors=True)
    drop(model, optimizer, ckpt)
    median, sync = statistics.median(stalls), statistics.median(syncs)
    return [
        f"state {nbytes / GIB:.2f} GiB; synchronous torch.save: {', '.join(f'{s:.2f}' for s in syncs)} s "
        f"(median {sync:.2f} s)",
        f"periodic save stalls: {', '.join(f'{s:.3f}' for s in stalls)} s "
        "(host buffer allocated in the background before the first save, then reused)",
        f"stall / torch.save = {median / sync * 100:.1f} % (medians of {len(stalls)} interleaved rounds; "
        f"goal <= 15 %: {'met' if median <= 0.15 * sync else 'MISSED'}); background upload to commit: "
        f"{', '.join(f'{u:.2f}' for u in uploads)} s",
    ]


# --------------------------------------------------------------------------


def parse_sizes(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--s3-sizes-gb", type=parse_sizes, default=[1.0, 2.0])
    p.add_argument("--file-sizes-gb", type=parse_sizes, default=[1.0, 4.0])
    p.add_argument("--stall-gb", type=float, default=1.0, help="0 skips the stall figures")
    p.add_argument("--sizes-gb", type=parse_sizes, default=None,
                   help="one list for both S3 and file:// (overrides the two above)")
    p.add_argument("--dir", type=Path, default=None,
                   help="where file:// checkpoints and dd write (default: a temp dir)")
    p.add_argument("--part-mb", type=int, default=DEFAULT_PART_BYTES // 2**20, help="checkpoint part size")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="parts uploaded at once")
    p.add_argument("--repeat", type=int, default=3, help="file:// runs per size (median shown)")
    p.add_argument("--s3-repeat", type=int, default=1, help="S3 runs per size (median shown)")
    p.add_argument("--stall-repeat", type=int, default=5, help="rounds of torch.save + periodic save (medians)")
    p.add_argument("--device", default="cpu", help="cpu or cuda: where the model lives")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--prepared", action="store_true",
                   help="flush after a step with nothing due, which makes the host buffer as training does")
    args = p.parse_args(argv)
    args.dtype = getattr(torch, args.dtype)
    args.part_bytes = args.part_mb * 2**20
    if args.sizes_gb is not None:
        args.s3_sizes_gb = args.file_sizes_gb = args.sizes_gb
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    scratch = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    control = scratch / "control"
    control.mkdir()
    rows: list[Row] = []
    try:
        if args.s3_sizes_gb:
            moto = Moto()
            try:
                for gib in args.s3_sizes_gb:
                    model, optimizer = make_state(gib, args.device, args.dtype)
                    ours_runs, naive_runs = [], []
                    for _ in range(args.s3_repeat):
                        moto.reset()
                        ours_runs.append(flush_seconds(model, optimizer, f"s3://{BUCKET}/ours", control, args)[0])
                        moto.reset()
                        naive_runs.append(naive_s3_seconds(model, optimizer, moto, scratch))
                    moto.reset()
                    rows.append(report("s3", model, optimizer, ours_runs, "torch.save + upload_file", "naive",
                                       naive_runs, ">= 2x"))
                    drop(model, optimizer)
            finally:
                moto.stop()
        for gib in args.file_sizes_gb:
            model, optimizer = make_state(gib, args.device, args.dtype)
            ours_runs, dd_runs = [], []
            for _ in range(args.repeat):  # interleaved: the disk's mood changes by the second
                ours, written = flush_seconds(model, optimizer, f"file://{scratch}/ours", control, args)
                shutil.rmtree(scratch / "ours")
                ours_runs.append(ours)
                dd_runs.append(dd_seconds(written, scratch))
            rows.append(report("file", model, optimizer, ours_runs, "dd bs=16M conv=fsync", "dd", dd_runs,
                               "<= 1.3x"))
            drop(model, optimizer)
        stall = stall_figures(args.stall_gb, args, scratch) if args.stall_gb > 0 else []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print()
    print(f"notice -> checkpoint committed (model + AdamW state, {args.dtype}, {args.device}; "
          f"parts of {args.part_mb} MiB, {args.workers} at once; {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}; medians of {args.repeat} file:// and {args.s3_repeat} S3 runs)")
    print(f"{'target':<5} {'state':>10}  {'ours':>10}  {'baseline':<28}{'':>10}  {'ratio':<16} {'goal':<10} result")
    for row in rows:
        print(row.line())
    if stall:
        print()
        print(f"training stall of one periodic save ({args.stall_gb:g} GiB state)")
        for line in stall:
            print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
