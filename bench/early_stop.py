"""Early stopping on a synthetic plateau: the GPU-hours and dollars it saves
against running to the end.

    .venv/bin/python bench/early_stop.py [--steps 3000] [--hours 8]

Trains examples/early_stop.py's model (the e2e test's run) for --steps
steps on the CPU, reporting val_loss every 10 steps, and replays those
reports as the product would see them: counted by the library's rule
(agent/checkpoint/reports.py, examples/early_stop.yaml's: patience 3,
min_delta 0.001, from step 200), folded by the agent to one per 3 s at the
GPU step time the run is given (--hours for all the steps; a report that
meets the rule goes at once), then judged by the broker
(broker/recovery/earlystop.judge).
Prints where it stops, the best step (whose checkpoint is kept) and its
val_loss against the last step's, and for two shapes priced at the bundled
catalog's cheapest AWS spot offer: GPU-hours and dollars to the end, to the
stop, and saved.
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import time
from pathlib import Path

import torch

from spotbroker.agent import protocol
from spotbroker.agent.checkpoint.reports import Rule
from spotbroker.agent.metricsfold import DEFAULT_INTERVAL
from spotbroker.broker.jobs.stoprule import EarlyStopRule
from spotbroker.broker.recovery.earlystop import judge

REPO = Path(__file__).resolve().parents[1]
CATALOG = REPO / "broker" / "pricing" / "catalog_data" / "aws_vms_gpu.csv"
RULE = EarlyStopRule(metric="val_loss", mode="min", patience=3, min_delta=0.001, min_steps=200)
LIBRARY_RULE = Rule.from_env(RULE.env_value())
SHAPES = (("T4", 1), ("A100", 8))


def curve(steps: int, every: int) -> list[tuple[int, float]]:
    spec = importlib.util.spec_from_file_location("early_stop_example", REPO / "examples" / "early_stop.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.set_num_threads(1)
    x_train, y_train, x_val, y_val = example.make_data(0)
    model = example.make_model(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=example.LR)
    reports = []
    for step in range(1, steps + 1):
        loss = torch.nn.functional.mse_loss(model(x_train), y_train)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % every == 0:
            with torch.no_grad():
                reports.append((step, torch.nn.functional.mse_loss(model(x_val), y_val).item()))
    return reports


def folded(reports: list[tuple[int, float]], step_seconds: float) -> list[dict]:
    """What the agent forwards: each report with the library's standing; a report within
    DEFAULT_INTERVAL s of the last sent waits (the newest wins) unless it is the first to meet the rule."""
    out, sent_at, held, extra, met_sent = [], -1e18, None, {}, False
    for step, value in reports:
        standing = LIBRARY_RULE.count(extra, step, value)
        held = {"step": step, "values": {"val_loss": value},
                **({protocol.EARLY_STOP: standing} if standing else {})}
        if step * step_seconds - sent_at >= DEFAULT_INTERVAL or (standing and standing["met"] and not met_sent):
            met_sent |= bool(standing and standing["met"])
            out.append(held)
            sent_at, held = step * step_seconds, None
    return out + ([held] if held else [])


def cheapest_spot(accelerator: str, count: int) -> tuple[str, float]:
    with open(CATALOG, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["AcceleratorName"] == accelerator
                and float(r["AcceleratorCount"] or 0) == count and r["SpotPrice"]]
    best = min(rows, key=lambda r: float(r["SpotPrice"]))
    return best["InstanceType"], float(best["SpotPrice"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3000, help="the run's steps to the end")
    p.add_argument("--hours", type=float, default=8.0, help="the run's wall time to the end on its GPUs")
    args = p.parse_args()
    started = time.monotonic()
    reports = curve(args.steps, 10)
    seen = folded(reports, args.hours * 3600 / args.steps)
    # The broker judges after each report it gets: the first prefix that fires is where it stops.
    verdict = next((v for data in seen if (v := judge([(data, None)], RULE))), None)
    train_s = time.monotonic() - started
    if verdict is None:
        print(f"the rule did not fire within {args.steps} steps: nothing saved")
        return
    stop = verdict.step
    at = dict(reports)
    fraction = stop / args.steps
    print(f"{len(reports)} reports ({len(seen)} after the agent's folding), trained in {train_s:.0f} s on the CPU")
    print(f"stopped at step {stop} of {args.steps} ({fraction:.1%} of the run); best step {verdict.best_step} "
          f"(kept), val_loss {at[verdict.best_step]:.6f} there, {at[args.steps]:.6f} at the end")
    print(f"{'shape':<22} {'$/h':>8} {'GPU-h to end':>13} {'GPU-h run':>10} {'GPU-h saved':>12} "
          f"{'$ to end':>9} {'$ run':>8} {'$ saved':>8}")
    for accelerator, count in SHAPES:
        instance, price = cheapest_spot(accelerator, count)
        full, run = args.hours * count, args.hours * fraction * count
        print(f"{instance + ' (' + accelerator + ':' + str(count) + ')':<22} {price:>8.4f} {full:>13.2f} {run:>10.2f} "
              f"{full - run:>12.2f} {args.hours * price:>9.2f} {args.hours * fraction * price:>8.2f} "
              f"{args.hours * (1 - fraction) * price:>8.2f}")


if __name__ == "__main__":
    main()
