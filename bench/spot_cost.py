"""The spot-sim-protocol §7 table with the product's policy as a column.

    .venv/bin/python bench/spot_cost.py [--traces-root bench/traces]

Prints, for the five V100 windows: Optimal (the DP lower bound), the
product's policy (spotbroker), our reruns of UP(S), greedy, single-zone UP
and SkyNomad (re-implemented from §5), and beside the last the published
SkyNomad figures; per window and mean, in dollars and as a ratio to
Optimal, with deadlines met, and a note on how close our SkyNomad comes to
the published one. Then the same arms on the 600 s trace set (sequential
tiles), the total run time, and the time one policy decision takes with 20
zones.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from spotbroker.broker.placement.policy.egress import region_of
from spotbroker.broker.placement.policy.model import Event, Observation, ZoneHistory, ZoneState
from spotbroker.broker.placement.policy.spotbroker import SpotBroker
from spotbroker.broker.sim.runner import job_from_hours, run_arm
from spotbroker.broker.sim.traces import load_traces

REPO = Path(__file__).resolve().parents[1]
V100_ZONES = ["us-east-1c", "us-east-2b", "us-west-2a"]
V100_STARTS = [3318, 5530, 7742, 8848, 15484]
V100_TILES = [3, 5, 7, 8, 14]
ZONES_600S = ["us-east-1f", "us-east-2a", "us-west-2c"]
PUBLISHED = {  # §7, $ per window
    "Optimal": [37.7413, 37.5424, 36.9954, 37.1943, 37.3932],
    "SkyNomad published": [42.9943, 45.1947, 37.0468, 40.4923, 42.9277],
    "UP(S)": [44.5295, 58.1110, 37.9954, 49.6173, 44.8355],
}
ARMS = [("Optimal", "optimal"), ("spotbroker", "spotbroker"), ("UP(S)", "up-s"), ("greedy", "greedy"),
        ("UP", "up"), ("SkyNomad (ours)", "skynomad")]
# Why our SkyNomad differs from the published one where it does (see docs/simulator.md,
# "SkyNomad"); the measured gaps are printed above this text.
SKYNOMAD_NOTE = """\
  Windows 7 and 8 match to $0.0001. Window 5 turns on details §5 leaves
  open: probing first at tick 6 rather than 0, or counting a hazard knot at
  exactly the run's age in H0(a), each brings it to +$0.15 (we keep the plain
  readings). Windows 3 and 14 are unmoved by every other reading we tried, and
  their cause is not identified (window 14's $0.02 is about one probe's price,
  $0.015-0.023). The readings that did matter, chosen as the text best supports
  and as the published windows confirm: a launch into a zone with an open probe
  run ends that run censored even when the launch fails, and a zone probed
  successfully is probed again only after a launch there succeeds."""


def run_all(traces, job, starts):
    """{label: (costs per window, deadlines met, seconds)}; UP is the mean over zones per window."""
    out = {}
    for label, arm in ARMS:
        t0 = time.perf_counter()
        runs = run_arm(arm, traces, job, starts)
        seconds = time.perf_counter() - t0
        if arm == "up":
            costs = [statistics.mean(r.result.cost for r in runs if r.start_tick == s) for s in starts]
        else:
            costs = [r.result.cost for r in runs]
        out[label] = (costs, sum(r.result.deadline_met for r in runs), len(runs), seconds)
    return out


def print_table(title, row_labels, results, published=None):
    published = published or {}
    labels = list(results) + [p for p in published if p not in results]
    optimal = results["Optimal"][0]
    print(f"\n{title}")
    print(f"{'window':>8} " + " ".join(f"{lab:>19}" for lab in labels))
    for i, row in enumerate(row_labels):
        cells = []
        for lab in labels:
            cost = results[lab][0][i] if lab in results else published[lab][i]
            cells.append(f"{cost:>9.4f} ({cost / optimal[i]:.3f})")
        print(f"{row:>8} " + " ".join(f"{c:>19}" for c in cells))
    cells = []
    for lab in labels:
        costs = results[lab][0] if lab in results else published[lab]
        cells.append(f"{statistics.mean(costs):>9.3f} ({statistics.mean(costs) / statistics.mean(optimal):.3f})")
    print(f"{'mean':>8} " + " ".join(f"{c:>19}" for c in cells))
    cells = [f"{results[lab][1]}/{results[lab][2]}" if lab in results else "published" for lab in labels]
    print(f"{'met':>8} " + " ".join(f"{c:>19}" for c in cells))
    if published.get("Optimal"):
        worst = max(abs(a - b) for a, b in zip(results["Optimal"][0], published["Optimal"]))
        worst_ups = max(abs(a - b) for a, b in zip(results["UP(S)"][0], published["UP(S)"]))
        print(f"reproduction: Optimal within ${worst:.4f}, UP(S) within ${worst_ups:.4f} of §7 per window")
    if "SkyNomad (ours)" in results and "SkyNomad published" in published:
        ours, theirs = results["SkyNomad (ours)"][0], published["SkyNomad published"]
        gaps = " ".join(f"{round(a - b, 4) + 0.0:+.4f}" for a, b in zip(ours, theirs))
        mean_ours, mean_theirs = statistics.mean(ours), statistics.mean(theirs)
        print(f"SkyNomad (ours): re-implemented from §5 (broker/sim/skynomad.py); published: §7.\n"
              f"  ours - published per window: {gaps}; mean {mean_ours:.3f} vs {mean_theirs:.3f} "
              f"({(mean_ours / mean_theirs - 1) * 100:+.2f} %).")
        print(SKYNOMAD_NOTE)


def decision_time(n_zones: int = 20, repeat: int = 2000) -> float:
    """Seconds per `decide` on a 20-zone observation with some history (plans cached)."""
    regions = ["us-east-1", "us-east-2", "us-west-2", "eu-west-1", "ap-south-1"]
    zones = []
    for i in range(n_zones):
        name = f"{regions[i % 5]}{'abcd'[i // 5]}"
        history = ZoneHistory()
        for k in range(50):
            history.record(Event.PROBE_OK if (k + i) % 4 else Event.PROBE_FAILED, k * 600.0)
        zones.append(ZoneState(name, region_of(name), 0.9 + i / 50, 3.06, history))
    obs = Observation(now_s=30000.0, step_s=600.0, work_left_s=100000.0, work_total_s=143780.0, started_s=0.0,
                      deadline_s=215670.0, restart_overhead_s=720.0, checkpoint_gb=50.0, zones=tuple(zones),
                      running=None, last_zone=zones[3].zone)
    policy = SpotBroker()
    policy.decide(obs)  # the plan for these estimates is solved once, then cached
    t0 = time.perf_counter()
    for _ in range(repeat):
        policy.decide(obs)
    return (time.perf_counter() - t0) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces-root", default=str(REPO / "bench" / "traces"))
    root = Path(parser.parse_args().traces_root)
    job = job_from_hours(39.93889, 59.90833, 0.2, 50)
    started = time.perf_counter()

    v100 = load_traces(root / "aws-v100-2023", V100_ZONES)
    results = run_all(v100, job, V100_STARTS)
    print_table("V100 (spot-sim-protocol §7): $ per run (ratio to Optimal); UP = mean over the 3 zones",
                [str(w) for w in V100_TILES], results, PUBLISHED)
    protocol_s = time.perf_counter() - started

    f600 = load_traces(root / "aws-v100-4node-600s", ZONES_600S)
    L = job.window_ticks(f600.gap_s)
    starts = [L * w for w in range((f600.n_ticks - 1) // L)]
    results_600 = run_all(f600, job, starts)
    print_table(f"600 s ticks, flat prices ({', '.join(ZONES_600S)}; tiles at ticks {starts})",
                [str(s) for s in starts], results_600)

    per_decision = decision_time()
    sb_runs = run_arm("spotbroker", v100, job, V100_STARTS)  # plans are cached by now: the steady state
    print("\ntimings")
    print(f"  whole V100 protocol, all arms, DP included: {protocol_s:.1f} s")
    for label, (_, _, _, seconds) in results.items():
        print(f"    {label:>15}: {seconds:.2f} s")
    decisions = sum(round((r.result.finish_s or 0) / v100.gap_s) for r in sb_runs)
    print(f"  spotbroker in the simulator: {results['spotbroker'][3] / decisions * 1e3:.3f} ms per decision "
          f"on average over {decisions} decisions, plan solves included")
    print(f"  one decision, 20 zones, plan cached: {per_decision * 1e3:.3f} ms")
    print(f"  total: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
