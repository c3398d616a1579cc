"""Commands about money, over HTTP: costs (a team's token, or the admin's
with --team) and budgets (the admin's token sets them)."""
from __future__ import annotations

import json
from typing import Any

import click

from spotbroker.broker.cli.access import admin_client, reader_client, team_client
from spotbroker.broker.cli.client import Client
from spotbroker.broker.cli.jobs import call
from spotbroker.broker.cli.output import FiniteFloat, show, table, when

GROUPS = ("day", "job", "cloud", "gpu", "zone")


class GroupBy(click.ParamType):
    """One of GROUPS, or label:KEY (by the value of the jobs' label KEY)."""

    name = "[" + "|".join(GROUPS) + "|label:KEY]"

    def convert(self, value, param, ctx):
        if value in GROUPS or (value.startswith("label:") and len(value) > len("label:")):
            return value
        self.fail(f"{value!r}: one of {', '.join(GROUPS)}, or label:KEY (label:project)", param, ctx)


def _team(c: Client, team: str | None) -> str:
    if team:
        return team
    return call(c.whoami)["name"]


@click.command()
@click.option("--team", default=None, help="the team (default: the token's own)")
@click.option("--since", default=None, help="ISO 8601 time or date, UTC unless it says (default: 30 days ago)")
@click.option("--until", default=None, help="ISO 8601 time or date, not included: a date is its first moment, so "
              "--until 2026-12-01 ends with November (default: now)")
@click.option("--group-by", "group_by", type=GroupBy(), default=None,
              help="label:KEY groups by the value of the jobs' label KEY ('(none)': jobs without it)")
@click.option("--json", "as_json", is_flag=True)
@click.option("--csv", "as_csv", is_flag=True, help="the grouped rows as CSV, for a spreadsheet")
def costs(team: str | None, since: str | None, until: str | None, group_by: str | None, as_json: bool,
          as_csv: bool) -> None:
    """A team's spend from the ledger: paid, on-demand equivalent, savings, waste, kWh and kg CO2e."""
    if as_csv and as_json:
        raise click.UsageError("--csv or --json, not both")
    c = reader_client(team)
    if as_csv:
        click.echo(call(c.costs_csv, _team(c, team), since, until, group_by), nl=False)
        return
    report = call(c.costs, _team(c, team), since, until, group_by)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    from rich.table import Table
    from rich.text import Text  # a team's own words (job names, label values) are never markup

    from spotbroker.broker.cli.output import console

    t = report["total"]
    title = (f"team {report['team']}: ${t['cost']:.2f} from {report['since'][:16]} to {report['until'][:16]}; "
             f"saved ${t['savings']:.2f} against on-demand, ${t['wasted']:.2f} of work lost; "
             f"{t.get('kwh', 0.0):.1f} kWh, {t.get('co2e_kg', 0.0):.1f} kg CO2e")
    table = Table(group_by.upper() if group_by else "", "COST $", "ON-DEMAND $", "SAVED $", "WASTED $",
                  "NODE-HOURS", "KWH", "KG CO2E", title=title)
    for g in report["groups"]:
        key = f"{g['key']} {g['name']}" if g.get("name") else g["key"]
        table.add_row(Text(key), *_figures(g))
    table.add_row("total", *_figures(t), style="bold")
    console().print(table)


def _figures(m: dict) -> list[str]:
    """A row's money, node-hours, energy and emissions (a broker without energy figures: 0)."""
    return [*(_amount(m[k]) for k in ("cost", "on_demand_cost", "savings", "wasted", "node_hours")),
            f"{m.get('kwh', 0.0):.2f}", f"{m.get('co2e_kg', 0.0):.3f}"]


def _amount(value: float) -> str:
    """Two decimals, or four under one (a short spot job's $0.0007 read 0.00, as if free)."""
    return f"{value:.2f}" if abs(value) >= 1 or value == 0 else f"{value:.4f}"


def energy_line(job: dict[str, Any]) -> str:
    """The job's energy and emissions, and for each attempt that ran the grid
    figure it was charged at, where that comes from, and whether its power
    was measured or estimated."""
    e = job["energy"]
    line = f"energy: {e['kwh']:.3f} kWh, {e['co2e_kg']:.3f} kg CO2e"
    if e.get("kwh_per_1000_steps") is not None:
        line += f", {e['kwh_per_1000_steps']:.4f} kWh per 1,000 steps"
    if e.get("kwh_per_epoch") is not None:
        line += f", {e['kwh_per_epoch']:.4f} kWh per epoch"
    places = [f"attempt {a['id']}: {a['energy']['grid_g_per_kwh']:.0f} g/kWh ({a['energy']['grid_source']}), "
              f"{a['energy']['basis']}" for a in job["attempts"]
              if a.get("energy") and a["energy"].get("grid_g_per_kwh") is not None]
    return line + ("; " + "; ".join(places) if places else "")


@click.group(invoke_without_command=True)
@click.pass_context
def budget(ctx: click.Context) -> None:
    """A team's budget: `budget show [TEAM]`, `budget set TEAM AMOUNT` (admin)."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


@budget.command("show")
@click.argument("team", required=False)
@click.option("--json", "as_json", is_flag=True)
def budget_show(team: str | None, as_json: bool) -> None:
    """Print a team's budget and where it stands this period (targets redacted)."""
    c = team_client()
    b = call(c.budget, _team(c, team))
    if as_json:
        click.echo(json.dumps(b, indent=2))
        return
    state = "OVER: " + b["hard_cap_action"] if b["over"] else "within"
    t = table("TEAM", "BUDGET $", "PERIOD", "FROM", "TO", "SPENT $", "REMAINING $", "STATE", "OVER IT",
              "RECOVERIES", "TARGETS")
    t.add_row(b["team"], f"{b['amount']:.2f}", b["period"], when(b["period_start"]), when(b["period_end"]),
              f"{b['spent']:.2f}", f"{b['remaining']:.2f}", state, b["hard_cap_action"], b["recoveries"],
              ", ".join(f"{x['name']} ({x['kind']})" for x in b["targets"]) or "-")
    show(t)


@budget.command("set", context_settings={"ignore_unknown_options": True})  # -3: the amount, refused as such
@click.argument("team")
@click.argument("amount", type=FiniteFloat(min=0, min_open=True))
@click.option("--period", type=click.Choice(["day", "week", "month"]), default=None,
              help="default: the budget's own period, month for a new budget")
@click.option("--hard-cap", "hard_cap", type=click.Choice(["hold_new", "stop_running"]), default=None,
              help="over budget: hold new jobs (default), or also stop running ones")
def budget_set(team: str, amount: float, period: str, hard_cap: str | None) -> None:
    """Set a team's budget (SPOTBROKER_ADMIN_TOKEN); other settings are kept."""
    c = admin_client()
    try:
        body = {k: v for k, v in call(c.budget, team).items()
                if k in ("period", "rules", "recoveries", "hard_cap_action")}
    except click.ClickException:
        body = {}
    body.update(amount=amount, period=period or body.get("period") or "month")
    if hard_cap:
        body["hard_cap_action"] = hard_cap
    out = call(c.set_budget, team, body)
    click.echo(f"team {team}: budget ${out['amount']:.2f} per {out['period']}, over it: {out['hard_cap_action']}")
