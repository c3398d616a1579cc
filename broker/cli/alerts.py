"""`alerts` and `silences`: a team's budget alerts and the silences on them,
over HTTP. Listing takes a team's token (its own team) or the admin's (any
team, or all); adding or ending a silence is the admin's."""
from __future__ import annotations

import json
from typing import Any

import click

from spotbroker.broker.cli.access import admin_client, reader_client
from spotbroker.broker.cli.jobs import call
from spotbroker.broker.cli.output import FiniteFloat, show, table, when

_TEAM = click.option("--team", default=None, help="the team (default: the token's own; the admin's: every team)")


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


@click.command()
@_TEAM
@click.option("--state", type=click.Choice(["open", "resolved", "all"]), default="all", show_default=True)
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def alerts(team: str | None, state: str, limit: int, as_json: bool) -> None:
    """Budget alerts, newest first."""
    params = {k: v for k, v in {"team": team, "state": state, "limit": limit}.items() if v is not None}
    found = call(lambda: reader_client(team)._request("GET", "/v1/alerts", params=params).json())["alerts"]
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    t = table("ID", "TEAM", "RULE", "STATE", "SEVERITY", "VALUE", "THRESHOLD", "FIRED", "RESOLVED", "SUMMARY")
    for a in found:
        t.add_row(str(a["id"]), a["team"], a["rule"], a["state"], a["severity"], _number(a["value"]),
                  _number(a["threshold"]), when(a["fired_at"]), when(a["resolved_at"]), a["summary"])
    show(t)


def _print_silences(found: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    t = table("ID", "TEAM", "RULE", "UNTIL", "CREATED")
    for s in found:
        t.add_row(str(s["id"]), s["team"], s["rule"], when(s["until"]), when(s["created_at"]))
    show(t)


@click.group(invoke_without_command=True)
@_TEAM
@click.option("--expired", is_flag=True, help="also those whose time is over")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def silences(ctx: click.Context, team: str | None, expired: bool, as_json: bool) -> None:
    """Silences on budget alerts: list (the default, with its options), add, expire."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(silences_list, team=team, expired=expired, as_json=as_json)


@silences.command("list")
@_TEAM
@click.option("--expired", is_flag=True, help="also those whose time is over")
@click.option("--json", "as_json", is_flag=True)
def silences_list(team: str | None = None, expired: bool = False, as_json: bool = False) -> None:
    """The silences, newest first (active ones unless --expired)."""
    params: dict[str, Any] = {"expired": str(expired).lower()}
    if team:
        params["team"] = team
    found = call(lambda: reader_client(team)._request("GET", "/v1/alerts/silences", params=params).json())
    _print_silences(found["silences"], as_json)


@silences.command("add")
@click.argument("team")
@click.argument("rule")
@click.option("--minutes", type=FiniteFloat(0, 60 * 24 * 90, min_open=True), required=True,
              help="how long nothing is sent for RULE")
@click.option("--json", "as_json", is_flag=True)
def silences_add(team: str, rule: str, minutes: float, as_json: bool) -> None:
    """Send nothing for RULE of TEAM's budget for a while (SPOTBROKER_ADMIN_TOKEN).
    RULE: fast_burn, slow_burn, forecast, committed, hard_cap, spend_N (every
    threshold), spend_50 etc., or * (all)."""
    body = {"team": team, "rule": rule, "minutes": minutes}
    out = call(lambda: admin_client()._request("POST", "/v1/alerts/silences", json=body).json())
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"silence {out['id']}: team {out['team']}, rule {out['rule']}, until {when(out['until'])} UTC")


@silences.command("expire")
@click.argument("silence_id", metavar="ID", type=click.IntRange(min=1))
def silences_expire(silence_id: int) -> None:
    """End a silence now (SPOTBROKER_ADMIN_TOKEN); it stays listed with --expired."""
    out = call(lambda: admin_client()._request("DELETE", f"/v1/alerts/silences/{silence_id}").json())
    click.echo(f"silence {out['id']} (team {out['team']}, rule {out['rule']}) ended at {when(out['until'])} UTC")
