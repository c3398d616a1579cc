"""`spotbroker simulate`: run one policy over windows of a trace set.

The options and the `--json` object are a contract other tools script
against; keep their names. Bad input (a missing zone file, traces that do not
line up, a window past the trace's end, a deadline shorter than the work)
ends with one line naming the problem and exit status 1 (2 for malformed
options, click's own convention).
"""
from __future__ import annotations

import json
import statistics

import click

from spotbroker.broker.sim.runner import ARMS, WindowRun, job_from_hours, run_arm
from spotbroker.broker.sim.traces import TraceError, load_traces


def _int_list(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected whole numbers separated by commas, got {value!r}") from None


def _zone_list(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    return [z.strip() for z in value.split(",") if z.strip()]


@click.command("simulate")
@click.option("--traces", "traces_dir", required=True, type=click.Path(file_okay=False),
              help="Directory of <zone>.json (or <zone>_*.json) trace files.")
@click.option("--zones", required=True, callback=_zone_list, help="Comma-separated zones; order breaks ties.")
@click.option("--policy", "policy_name", type=click.Choice(ARMS), default="spotbroker", show_default=True)
@click.option("--job-hours", type=float, required=True, help="Productive hours the job needs.")
@click.option("--deadline-hours", type=float, required=True, help="Hours from the window's start to the deadline.")
@click.option("--restart-hours", type=float, default=0.2, show_default=True, help="Overhead after every launch.")
@click.option("--checkpoint-gb", type=float, default=50.0, show_default=True, help="Checkpoint moved between regions.")
@click.option("--start-ticks", required=True, callback=_int_list, help="Comma-separated first ticks of the windows.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Draw the runs' timelines to this PNG (needs matplotlib).")
def simulate(traces_dir: str, zones: list[str], policy_name: str, job_hours: float, deadline_hours: float,
             restart_hours: float, checkpoint_gb: float, start_ticks: list[int], as_json: bool,
             plot_path: str | None) -> None:
    """Simulate a placement policy on spot traces (spot-sim-protocol)."""
    try:
        job = job_from_hours(job_hours, deadline_hours, restart_hours, checkpoint_gb)
        traces = load_traces(traces_dir, zones)
        runs = run_arm(policy_name, traces, job, start_ticks, keep_timeline=plot_path is not None)
    except TraceError as exc:
        raise click.ClickException(str(exc)) from None
    mean = statistics.mean(r.result.cost for r in runs)
    if as_json:
        click.echo(json.dumps(_as_json(policy_name, runs, mean)))
    else:
        click.echo(_table(policy_name, runs, mean, traces.gap_s))
    if plot_path:
        from spotbroker.broker.sim.plot import plot_runs

        try:
            plot_runs(runs, traces.names, traces.gap_s, job, plot_path, title=f"{policy_name}")
        except ImportError as exc:
            raise click.ClickException(f"--plot needs matplotlib ({exc.name} is missing): "
                                       "pip install 'spotbroker[plot]'") from None


def _as_json(policy: str, runs: list[WindowRun], mean: float) -> dict:
    windows = []
    for r in runs:
        row = {"start_tick": r.start_tick, "cost": round(r.result.cost, 6), "deadline_met": r.result.deadline_met}
        if r.zone is not None:
            row["zone"] = r.zone
        windows.append(row)
    return {"policy": policy, "windows": windows, "mean_cost": round(mean, 6)}


def _table(policy: str, runs: list[WindowRun], mean: float, gap_s: int) -> str:
    lines = [f"policy: {policy}",
             (f"{'start tick':>10} {'zone':>14} {'cost $':>9} {'deadline':>8} {'spot h':>7} {'od h':>6} "
              f"{'launches':>8} {'preempted':>9} {'egress $':>8}")]
    for r in runs:
        x = r.result
        lines.append(
            f"{r.start_tick:>10} {r.zone or '-':>14} {x.cost:>9.4f} {'met' if x.deadline_met else 'MISSED':>8} "
            f"{x.spot_ticks * gap_s / 3600:>7.1f} {x.on_demand_ticks * gap_s / 3600:>6.1f} "
            f"{x.launches:>8} {x.preemptions:>9} {x.egress:>8.2f}")
    met = sum(r.result.deadline_met for r in runs)
    lines.append(f"mean cost ${mean:.4f} over {len(runs)} runs; deadlines met {met}/{len(runs)}")
    return "\n".join(lines)
