"""The same small regression as ``train.py``, data-parallel over ranks (DDP, gloo on CPU).

    torchrun --nproc_per_node=2 examples/ddp_train.py --steps 100 --checkpoint-uri file:///tmp/ckpt
    torchrun --nproc_per_node=2 examples/ddp_train.py --sharded ...   # every rank writes its shard (DCP)

Each rank draws its own batch of each step from (seed, step, rank), so a run
stopped at any step and restored from its checkpoint sees the same data as an
uninterrupted one and ends with the same loss. Under the spotbroker agent
every rank hears a preemption notice, the ranks agree on one step, and the
checkpoint holds that step for all of them. The library's lines are marked.
Rank 0 prints ``start_step=``, ``step=`` and, last, ``final_loss=<float>``.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from spotbroker.agent.checkpoint import Checkpointer

IN_FEATURES, OUT_FEATURES = 32, 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-seconds", type=float, default=0.0, help="minimum wall time per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=32, help="per rank")
    p.add_argument("--checkpoint-uri", default=None, help="default: $CHECKPOINT_URI")
    p.add_argument("--every-steps", type=int, default=50)
    p.add_argument("--every-seconds", type=float, default=600.0)
    p.add_argument("--sharded", action="store_true", help="save through torch.distributed.checkpoint")
    p.add_argument("--log-every", type=int, default=10)
    return p.parse_args(argv)


def make_model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(IN_FEATURES, hidden), nn.ReLU(), nn.Dropout(0.1),
                         nn.Linear(hidden, OUT_FEATURES))


def batch(seed: int, step: int, rank: int, size: int, teacher: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1009 + rank)
    x = torch.randn(size, IN_FEATURES, generator=g)
    with torch.no_grad():
        return x, teacher(x)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s rank {os.environ.get('RANK', '0')} %(name)s %(levelname)s %(message)s")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    teacher = make_model(args.hidden).eval()
    model = DistributedDataParallel(make_model(args.hidden))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, args.steps // 3), gamma=0.5)
    torch.manual_seed(args.seed + 1 + rank)  # each rank's own dropout

    # --- the checkpoint library: every rank makes one, after init_process_group ---
    ckpt = Checkpointer(model, optimizer, scheduler, uri=args.checkpoint_uri, every_steps=args.every_steps,
                        every_seconds=args.every_seconds, sharded=args.sharded)
    start = ckpt.restore()
    if rank == 0:
        print(f"start_step={start}", flush=True)

    for step in range(start, args.steps):
        began = time.monotonic()
        model.train()
        x, y = batch(args.seed, step, rank, args.batch, teacher)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        if rank == 0 and args.log_every and (step + 1) % args.log_every == 0:
            print(f"step={step + 1} loss={loss.item():.6f}", flush=True)
        left = args.step_seconds - (time.monotonic() - began)
        if left > 0:
            time.sleep(left)
        ckpt.step(step + 1)  # every rank, at every boundary: the ranks agree on saves and flushes here
    ckpt.close()

    model.eval()
    x, y = batch(args.seed, 2**40, 0, 1024, teacher)
    with torch.no_grad():
        final = nn.functional.mse_loss(model(x), y).item()
    if rank == 0:
        print(f"final_loss={final:.6f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
