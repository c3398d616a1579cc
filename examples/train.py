"""A small, deterministic PyTorch training run that survives preemption.

Synthetic regression on the CPU: a teacher network drawn from the seed makes
the targets, a student MLP with dropout learns them with AdamW and a step
learning-rate schedule. Each step's batch is drawn from a generator seeded
with (seed, step), never from a consumed iterator, so a run stopped at any
step and restored from its checkpoint sees the same data as an uninterrupted
one, and (with the RNG states restored too) ends with the same loss.

    python examples/train.py --steps 200 --seed 1 --checkpoint-uri file:///tmp/ckpt

Under the spotbroker agent the checkpoint location, resume point and flush
requests come from the environment; the two lines that matter are marked
below. The last line printed is ``final_loss=<float>``.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time

import torch
from torch import nn

from spotbroker.agent.checkpoint import Checkpointer

IN_FEATURES = 32
OUT_FEATURES = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200, help="optimizer steps in all")
    p.add_argument("--step-seconds", type=float, default=0.0, help="minimum wall time per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=64, help="width of the hidden layers")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--checkpoint-uri", default=None,
                   help="where checkpoints go (default: $CHECKPOINT_URI; none: no checkpoints)")
    p.add_argument("--every-steps", type=int, default=50)
    p.add_argument("--every-seconds", type=float, default=600.0)
    p.add_argument("--keep-last", type=int, default=None)
    p.add_argument("--half", choices=["fp16", "bf16"], default=None,
                   help="store float tensors at half width (smaller, not bit-exact on resume)")
    p.add_argument("--log-every", type=int, default=50)
    return p.parse_args(argv)


def make_model(hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(IN_FEATURES, hidden), nn.ReLU(), nn.Dropout(0.1),
        nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(0.1),
        nn.Linear(hidden, OUT_FEATURES),
    )


def batch(seed: int, index: int, size: int, teacher: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of step ``index``: a pure function of (seed, index)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + index)
    x = torch.randn(size, IN_FEATURES, generator=g)
    with torch.no_grad():
        y = teacher(x) + 0.01 * torch.randn(size, OUT_FEATURES, generator=g)
    return x, y


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    torch.set_num_threads(1)  # same arithmetic order on every machine and run
    torch.manual_seed(args.seed)
    teacher = make_model(args.hidden).eval()
    model = make_model(args.hidden)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, args.steps // 3), gamma=0.5)
    loss_fn = nn.MSELoss()

    # --- the checkpoint library: these two lines (and ckpt.step below) ---
    ckpt = Checkpointer(model, optimizer, scheduler, uri=args.checkpoint_uri,
                        every_steps=args.every_steps, every_seconds=args.every_seconds,
                        keep_last=args.keep_last, half=args.half)
    device = ckpt.device  # cuda where there is one, else cpu (a pre-flight's)
    model.to(device)  # (the targets' teacher stays on the CPU: the batches are drawn there)
    start = ckpt.restore()
    print(f"start_step={start}", flush=True)

    loss = torch.tensor(float("nan"))
    for step in range(start, args.steps):
        began = time.monotonic()
        model.train()
        x, y = (t.to(device) for t in batch(args.seed, step, args.batch, teacher))
        loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        if args.log_every and (step + 1) % args.log_every == 0:
            print(f"step={step + 1} loss={loss.item():.6f}", flush=True)
        left = args.step_seconds - (time.monotonic() - began)
        if left > 0:
            time.sleep(left)
        ckpt.step(step + 1)  # a step boundary: periodic saves and flush requests happen here
    ckpt.close()

    # The score: a fixed held-out batch, with dropout off.
    model.eval()
    x, y = (t.to(device) for t in batch(args.seed, 2**40, 1024, teacher))  # an index no step uses
    with torch.no_grad():
        final = loss_fn(model(x), y).item()
    print(f"last_train_loss={loss.item():.6f}", flush=True)
    print(f"final_loss={final:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
