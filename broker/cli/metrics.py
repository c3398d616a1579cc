"""`spotbroker metrics ID`: what a job's trainer reported (`ckpt.report`),
one row per step and attempt, a column per metric; and what its early stop
did and saved."""
from __future__ import annotations

from typing import Any

import click

from spotbroker.broker.cli.access import token_client
from spotbroker.broker.cli.jobs import _echo_json, call
from spotbroker.broker.cli.output import show, table


def early_stop_lines(stop: dict[str, Any]) -> list[str]:
    """The job's early stop in words (also under `spotbroker job ID`)."""
    lines = [f"early stop on {stop['metric']}: best {stop['best_value']:g} at step {stop['best_step']}, "
             + (f"stopped at step {stop['stopped_step']}" if stop["done"] else "stopping")]
    kept = stop.get("checkpoint")
    if kept:
        how = "saved at the best report" if kept["choice"] == "best" else "the first committed at or after the best"
        lines.append(f"  kept checkpoint {kept['id']} (step {kept['step']}, {how}): {kept['uri']}")
    lines.append(f"  run {stop['hours_run']:.2f} h, ${stop['dollars_run']:.4f}; "
                 + (f"saved {stop['hours_saved']:.2f} h, ${stop['dollars_saved']:.4f} ({stop['saving']})"
                    if stop.get("dollars_saved") is not None else stop.get("saving", "")))
    return lines


@click.command("metrics")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
def metrics(job_id: int, as_json: bool) -> None:
    """A job's reported metrics by step, across attempts, and its early stop."""
    c = token_client()
    found = call(c.metrics, job_id)
    if as_json:
        _echo_json(found)
        return
    names = sorted(found["metrics"])
    rows: dict[tuple[int, int], dict[str, float]] = {}
    for name, points in found["metrics"].items():
        for p in points:
            rows.setdefault((p["step"], p["attempt_id"]), {})[name] = p["value"]
    out = table("STEP", "ATTEMPT", *(n.upper() for n in names), title=f"job {job_id}: metrics")
    for (step, attempt), values in sorted(rows.items()):
        out.add_row(str(step), str(attempt), *(f"{values[n]:.6g}" if n in values else "-" for n in names))
    if not rows:
        click.echo(f"job {job_id} has reported no metrics (ckpt.report(step, name=value) in the trainer)")
    else:
        show(out)
    rule = found.get("early_stop")
    if rule:
        click.echo(f"early_stop: {rule['metric']} ({rule['mode']}), patience {rule['patience']}, "
                   f"min_delta {rule['min_delta']:g}, from step {rule['min_steps']}")
        stop = call(c.job, job_id).get("early_stop")
        click.echo("\n".join(early_stop_lines(stop)) if stop else "  not fired")
