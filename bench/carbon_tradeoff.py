"""Dollars against kg CO2e as the carbon price rises: the placement policy
in the trace simulator, each zone's prices weighed as the placer weighs them.

    .venv/bin/python bench/carbon_tradeoff.py [--traces-root DIR] [--windows N] [--plot docs/carbon_tradeoff.png]

For each bundled trace set (the V100 protocol's three zones and five
windows; the 600 s set's three zones, tiled) and each carbon price (0, 50,
100, 200 $/t), the product's policy (`SpotBroker`) runs every window with
each zone's spot and on-demand prices raised by the price × the node's
expected emissions per hour (what `broker/placement/placer.py` feeds it:
`carbon.surcharge`); the simulator bills the real dollar prices. The node
is a p3.2xlarge (1 V100, 8 vCPU, 61 GiB: `energy.power.estimate`, PUE
included), and a zone's grid is its region's snapshot figure
(`energy.grid.intensity('aws', region)`). Emissions count every tick a
node ran (the protocol leaves the completing interval unbilled, but the node
drew power in it); probes (a minute of spot each) are left out.

The bundled traces' regions (us-east-1, us-east-2, us-west-2) differ little
in intensity (322-411 g/kWh), so a third set, marked "what-if", runs the
V100 windows with the same availability and prices but the zones put on
grids far apart: us-east-2b and us-west-2a, priced alike ($0.918/h most of
the time), on eu-north-1's grid (9 g/kWh) and ap-south-1's (708), and the
dearer us-east-1c on us-east-1's. It is not a measurement of any real
place: it shows what the weighing does where equally priced places differ
as much as grids do across the world.
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from spotbroker.broker.energy import grid, power
from spotbroker.broker.placement.carbon import surcharge
from spotbroker.broker.placement.policy.model import Decision, Observation, Policy
from spotbroker.broker.placement.policy.spotbroker import SpotBroker
from spotbroker.broker.sim.engine import run_window
from spotbroker.broker.sim.runner import check_windows, job_from_hours
from spotbroker.broker.sim.traces import TraceSet, load_traces

REPO = Path(__file__).resolve().parents[1]
SHARED = Path("/work/shared/data/traces")
PRICES = (0.0, 50.0, 100.0, 200.0)  # $ per tonne CO2e
V100_ZONES = ["us-east-1c", "us-east-2b", "us-west-2a"]
V100_STARTS = [3318, 5530, 7742, 8848, 15484]
ZONES_600S = ["us-east-1f", "us-east-2a", "us-west-2c"]
WHAT_IF_REGIONS = {"us-east-1c": "us-east-1", "us-east-2b": "eu-north-1", "us-west-2a": "ap-south-1"}
NODE_KW = power.estimate("aws", "V100", 1, 8, 61).kw  # p3.2xlarge


@dataclass
class CarbonPriced:
    """The policy deciding on prices raised by what each zone's emissions are worth."""

    inner: Policy
    extra: dict[str, float]  # zone -> $ per node-hour
    name: str = "spotbroker+carbon"
    decisions: list = field(default_factory=list)

    def decide(self, obs: Observation) -> Decision:
        zones = tuple(replace(z, spot_price=z.spot_price + self.extra[z.zone],
                              on_demand_price=z.on_demand_price + self.extra[z.zone]) for z in obs.zones)
        return self.inner.decide(replace(obs, zones=zones))


@dataclass(frozen=True)
class Row:
    dollars: float  # mean per window
    kg: float       # mean per window
    met: int
    windows: int
    spot_share: float


def run_set(traces: TraceSet, job, starts: list[int], regions: dict[str, str], price: float) -> Row:
    g = {z.zone: grid.intensity("aws", regions.get(z.zone, z.region)).g_per_kwh for z in traces.zones}
    kg_h = {zone: NODE_KW * v / 1000 for zone, v in g.items()}
    extra = {zone: surcharge(price, kg) for zone, kg in kg_h.items()}
    dollars, kgs, met, spot, ran = [], [], 0, 0, 0
    for start in starts:
        window = traces.window(start, traces.n_ticks - start)
        result = run_window(window, CarbonPriced(SpotBroker(), extra), job, keep_timeline=True)
        hours = traces.gap_s / 3600
        kgs.append(sum(kg_h[window.zones[s.zone].zone] * hours for s in result.timeline if s.zone is not None))
        dollars.append(result.cost)
        met += result.deadline_met
        spot += result.spot_ticks
        ran += result.spot_ticks + result.on_demand_ticks
    return Row(statistics.mean(dollars), statistics.mean(kgs), met, len(starts), spot / max(ran, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces-root", default=str(SHARED if SHARED.is_dir() else REPO / "bench" / "traces"))
    parser.add_argument("--windows", type=int, default=0, help="at most this many windows per set (0: all)")
    parser.add_argument("--prices", default=",".join(f"{p:g}" for p in PRICES), help="$ per tonne, the first 0")
    parser.add_argument("--plot", default=str(REPO / "docs" / "carbon_tradeoff.png"))
    args = parser.parse_args()
    root = Path(args.traces_root)
    job = job_from_hours(39.93889, 59.90833, 0.2, 50)
    v100 = load_traces(root / "aws-v100-2023", V100_ZONES)
    f600 = load_traces(root / "aws-v100-4node-600s", ZONES_600S)
    tiles = job.window_ticks(f600.gap_s)
    sets = [("aws-v100-2023", v100, V100_STARTS, {}),
            ("aws-v100-4node-600s", f600, [tiles * w for w in range((f600.n_ticks - 1) // tiles)], {}),
            ("what-if: V100 on far-apart grids", v100, V100_STARTS, WHAT_IF_REGIONS)]
    started = time.perf_counter()
    print(f"node: p3.2xlarge, {NODE_KW:.3f} kW at the wall (PUE included)\n")
    results: dict[str, list[tuple[float, Row]]] = {}
    for name, traces, starts, regions in sets:
        starts = starts[:args.windows] if args.windows else starts
        check_windows(traces, job, starts)
        grids = ", ".join(f"{z.zone} {regions.get(z.zone, z.region)} "
                          f"{grid.intensity('aws', regions.get(z.zone, z.region)).g_per_kwh:.0f} g/kWh"
                          for z in traces.zones)
        print(f"{name} ({len(starts)} windows; {grids})")
        print("| $/t CO2e | $ per window | kg CO2e per window | Δ$ vs cost-only | Δkg vs cost-only "
              "| $ per tonne avoided | spot share | deadlines met |")
        print("|---|---|---|---|---|---|---|---|")
        prices = [float(p) for p in args.prices.split(",")]
        rows = results[name] = [(price, run_set(traces, job, starts, regions, price)) for price in prices]
        base = rows[0][1]
        for price, r in rows:
            print(f"| {price:g} | {r.dollars:.3f} | {r.kg:.2f} | {r.dollars - base.dollars:+.3f} "
                  f"({(r.dollars / base.dollars - 1) * 100:+.2f} %) | {r.kg - base.kg:+.2f} "
                  f"({(r.kg / base.kg - 1) * 100:+.2f} %) | {per_tonne(r, base)} | {r.spot_share * 100:.1f} % "
                  f"| {r.met}/{r.windows} |")
        print()
    print(f"total: {time.perf_counter() - started:.1f} s")
    if args.plot:
        plot(results, Path(args.plot))
        print(f"plot: {args.plot}")


def per_tonne(r: Row, base: Row) -> str:
    """What each tonne avoided cost in dollars (negative: it saved dollars too)."""
    avoided = (base.kg - r.kg) / 1000
    return f"{(r.dollars - base.dollars) / avoided:,.0f}" if avoided > 1e-6 else "–"


def plot(results: dict[str, list[tuple[float, Row]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # one scale for every panel, so that a set whose grids barely differ shows how little moves
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4.2), sharex=True, sharey=True)
    for ax, (name, rows) in zip(axes, results.items()):
        base = rows[0][1]
        points: dict[tuple[float, float], list[float]] = {}
        for price, r in rows:
            point = (round((r.kg / base.kg - 1) * 100, 2), round((r.dollars / base.dollars - 1) * 100, 2))
            points.setdefault(point, []).append(price)
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", color="tab:green")
        for (x, y), prices in points.items():  # prices that land on one point share a label
            ax.annotate(", ".join(f"${p:g}" for p in prices) + "/t", (x, y), textcoords="offset points",
                        xytext=(6, -12) if prices[0] == 0 else (6, 4), fontsize=8)
        ax.axhline(0, color="grey", lw=0.5)
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_title(f"{name}\ncost-only: ${base.dollars:.2f}, {base.kg:.2f} kg CO2e per window", fontsize=9)
        ax.set_xlabel("kg CO2e vs cost-only (%)")
        ax.set_ylabel("dollars vs cost-only (%)")
    fig.suptitle("Carbon price trade-off: spotbroker policy in the trace simulator (p3.2xlarge; grid: snapshot "
                 "per region)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
