"""The policy beyond the protocol's five windows: 191 windows built from the
bundled trace sets (other zone triples, start ticks, five and nine zones,
the 600 s set, four triples held out while the policy was designed), with
the protocol's job. Prints, per set, the policy's mean cost over Optimal's
and the deadlines met; and the mean of the per-window ratios over all.

    python bench/spot_wider.py [--policy spotbroker] [--sets P,Q,...] [--jobs N] [--optimal-cache FILE]

The sets are described in docs/simulator.md ("The wider check"). Each set's
windows are split in two halves, A (the 1st, 3rd, ... window) and B (the
2nd, 4th, ...): develop a change on one half and judge it on the other
(a change fitted to the bundled traces shows as a gain on one half only).
`--optimal-cache` keeps Optimal's dollars per window in a JSON file (the DP
is most of the run time; the key names the trace set, zones and start tick).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from spotbroker.broker.sim.runner import job_from_hours, run_arm
from spotbroker.broker.sim.traces import load_traces

TRACES = Path(__file__).resolve().parent / "traces"
V100, FLAT600 = TRACES / "aws-v100-2023", TRACES / "aws-v100-4node-600s"
JOB = job_from_hours(39.93889, 59.90833, 0.2, 50)
PROTOCOL_TICKS = [3318, 5530, 7742, 8848, 15484]


def _zones(short: str) -> list[str]:
    """'1c,2b,w-2a' -> us-east-1c, us-east-2b, us-west-2a."""
    return [f"us-west-{z[2:]}" if z.startswith("w-") else f"us-east-{z}" for z in short.split(",")]


def _tiles(directory: Path, zones: list[str], offset: int = 0) -> list[int]:
    """Back-to-back windows from `offset` to the end of the trace."""
    traces = load_traces(directory, zones)
    length = JOB.window_ticks(traces.gap_s)
    return list(range(offset, traces.n_ticks - length, length))


SETS: dict[str, tuple[Path, str, int | None]] = {
    # name: (trace set, zones, tile offset; None = the protocol's five start ticks)
    "P": (V100, "1c,2b,w-2a", None),
    "Ph": (V100, "1c,2b,w-2a", 553),
    "Q": (V100, "1d,2a,w-2b", 0),
    "R": (V100, "1f,1a,w-2c", 0),
    "S": (V100, "1a,1c,1d", 0),
    "T": (V100, "w-2a,w-2b,w-2c,2a,2b", 0),
    "U": (V100, "2b,w-2b,1f", 300),
    "N": (V100, "1a,1c,1d,1f,2a,2b,w-2a,w-2b,w-2c", None),
    "F": (FLAT600, "1f,2a,w-2c", 0),
    "Fh": (FLAT600, "1f,2a,w-2c", 180),
    "W1": (V100, "1a,1c,1f", 200),
    "W2": (V100, "1c,2a,w-2b", 200),
    "W3": (V100, "1a,2b,w-2c", 200),
    "W4": (V100, "1c,w-2a,w-2b", 200),
}


def _key(name: str, start: int) -> str:
    directory, short, _ = SETS[name]
    return f"{directory.name}/{short}/{start}"


def _window(task: tuple[str, str, int, float | None, int, float]) -> tuple[str, int, float, float, bool]:
    name, policy, start, optimal, memory, half_life = task
    directory, short, _ = SETS[name]
    traces = load_traces(directory, _zones(short))
    if optimal is None:
        (opt,) = run_arm("optimal", traces, JOB, [start])
        optimal = opt.result.cost
    (run,) = run_arm(policy, traces, JOB, [start], memory_ticks=memory,
                      memory_half_life_s=half_life * 3600 if half_life else None)
    return name, start, optimal, run.result.cost, run.result.deadline_met


def _half_means(results: list, name: str | None = None) -> tuple[float, float]:
    """Mean per-window ratio over half A (even positions in its set) and half B."""
    halves: tuple[list, list] = ([], [])
    for n in dict.fromkeys(r[0] for r in results):
        if name is None or n == name:
            for i, r in enumerate(r for r in results if r[0] == n):
                halves[i % 2].append(r[3] / r[2])
    return tuple(statistics.mean(h) if h else float("nan") for h in halves)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="spotbroker")
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    ap.add_argument("--memory-ticks", type=int, default=0,
                    help="start each window knowing the zones over this many ticks before it (not the protocol's rule)")
    ap.add_argument("--memory-half-life-h", type=float, default=0,
                    help="the memory's samples fade by their age at the window's start (hours; 0: no fading)")
    ap.add_argument("--optimal-cache", help="JSON file of Optimal's $ per window (read, then updated)")
    args = ap.parse_args()
    names = args.sets.split(",")
    cache = {}
    if args.optimal_cache and os.path.exists(args.optimal_cache):
        with open(args.optimal_cache) as f:
            cache = json.load(f)
    tasks = []
    for name in names:
        directory, short, offset = SETS[name]
        starts = PROTOCOL_TICKS if offset is None else _tiles(directory, _zones(short), offset)
        tasks += [(name, args.policy, s, cache.get(_key(name, s)), args.memory_ticks,
                   args.memory_half_life_h) for s in starts]
    t = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(_window, tasks, chunksize=2))
    if args.optimal_cache:
        cache.update({_key(r[0], r[1]): r[2] for r in results})
        with open(args.optimal_cache, "w") as f:
            json.dump(cache, f, indent=0, sort_keys=True)
    memory = f", memory of {args.memory_ticks} ticks before each window" if args.memory_ticks else ""
    if args.memory_ticks and args.memory_half_life_h:
        memory += f", fading by half every {args.memory_half_life_h:g} h"
    print(f"policy {args.policy}{memory}: {len(results)} windows in {time.perf_counter() - t:.0f} s")
    print(f"{'set':>4} {'zones':>36} {'windows':>7} {'ratio':>6} {'half A':>6} {'half B':>6} {'met':>5}")
    for name in names:
        rows = [r for r in results if r[0] == name]
        ratio = sum(r[3] for r in rows) / sum(r[2] for r in rows)
        met = sum(r[4] for r in rows)
        a, b = _half_means(results, name)
        print(f"{name:>4} {SETS[name][1]:>36} {len(rows):>7} {ratio:6.3f} {a:6.3f} {b:6.3f} {met:>2}/{len(rows)}")
    per_window = statistics.mean(r[3] / r[2] for r in results)
    met = sum(r[4] for r in results)
    a, b = _half_means(results)
    print(f" all {'':>36} {len(results):>7} {per_window:6.3f} {a:6.3f} {b:6.3f} {met}/{len(results)}"
          "  (means of per-window ratios)")


if __name__ == "__main__":
    main()
