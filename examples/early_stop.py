"""Early stopping with spotbroker: report a validation metric, and the broker
stops the run once it stops improving, keeping the best step's weights.

A small regression that overfits: a few noisy training samples and more
features than samples, so the validation loss falls, flattens and then
rises. Deterministic on the CPU for a seed (the data is drawn from it at
start, before the checkpoint is restored), so a preempted run resumes the
same curve.

    spotbroker submit examples/early_stop.yaml

The job says ``early_stop: {metric: val_loss, ...}``; the lines that matter
are marked below. Each report is printed as ``report step=N val_loss=X
weights=W`` (W: the sum of the weights, to check a kept checkpoint against).
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from spotbroker.agent.checkpoint import Checkpointer

FEATURES, TRAIN, VALIDATION = 48, 32, 512
LR = 5e-4


def weights_sum(model: nn.Module) -> float:
    """One number that changes with any weight: the kept checkpoint's is compared with the log's."""
    return sum(p.detach().double().sum().item() for p in model.parameters())


def make_data(seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    truth = torch.randn(FEATURES, 1, generator=gen)
    x_train, x_val = torch.randn(TRAIN, FEATURES, generator=gen), torch.randn(VALIDATION, FEATURES, generator=gen)
    noise = lambda n: 0.8 * torch.randn(n, 1, generator=gen)  # noqa: E731
    return x_train, x_train @ truth + noise(TRAIN), x_val, x_val @ truth + noise(VALIDATION)


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 128), nn.Tanh(), nn.Linear(128, 1))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20_000, help="the most optimizer steps (early stop ends it sooner)")
    p.add_argument("--report-every", type=int, default=10, help="steps between validation reports")
    p.add_argument("--step-seconds", type=float, default=0.0, help="minimum wall time per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-uri", default=None, help="without the agent: where to checkpoint")
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # a model this small only loses time to more threads

    x_train, y_train, x_val, y_val = make_data(args.seed)
    model = make_model(args.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    ckpt = Checkpointer(model, optimizer, uri=args.checkpoint_uri, every_seconds=300)
    for step in range(ckpt.restore(), args.steps):
        started = time.monotonic()
        loss = nn.functional.mse_loss(model(x_train), y_train)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        done = step + 1
        if done % args.report_every == 0:
            with torch.no_grad():
                val_loss = nn.functional.mse_loss(model(x_val), y_val).item()
            print(f"report step={done} val_loss={val_loss:.6f} weights={weights_sum(model)!r}", flush=True)
            ckpt.report(done, val_loss=val_loss, train_loss=loss.item())  # <- the broker judges early_stop on it
        ckpt.step(done)
        if ckpt.should_stop:  # <- the broker stopped the run: its checkpoint is committed
            print(f"stopped early at step {done}", flush=True)
            break
        time.sleep(max(0.0, args.step_seconds - (time.monotonic() - started)))
    ckpt.close()


if __name__ == "__main__":
    main()
