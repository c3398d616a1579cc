"""`spotbroker teams policy set|show`: a team's defaults and limits over HTTP
(`PUT /v1/teams/{team}/policy` with SPOTBROKER_ADMIN_TOKEN; a team's token
reads its own)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from spotbroker.broker.cli.access import admin_client, team_client
from spotbroker.broker.cli.jobs import call
from spotbroker.broker.cli.output import show as show_table
from spotbroker.broker.cli.output import table

FIELDS = ("envs", "allowed_accelerators", "max_price_per_hour", "max_nodes", "max_gpus_running", "preflight",
          "early_stop", "checkpoint", "checkpoint_retention_days", "carbon_price_per_tonne")


@click.group("policy")
def policy() -> None:
    """A team's defaults and limits (set by the admin; a team reads its own)."""


def _read_file(file: Path) -> dict[str, Any]:
    from spotbroker.broker.jobs.spec import SpecShapeError, SpecSyntaxError, load_raw

    try:
        data = file.read_bytes()
    except OSError as exc:
        raise click.ClickException(f"{file}: {exc.strerror}") from None
    try:
        doc = load_raw(data, "json" if file.suffix == ".json" else "yaml")
    except SpecSyntaxError as exc:
        raise click.ClickException(f"{file}{f':{exc.line}' if exc.line else ''}: {exc.message}") from None
    except SpecShapeError as exc:
        raise click.ClickException(f"{file}: {exc.field}: {exc.detail}") from None
    return doc


def _pairs(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r} is not KEY=VALUE", param_hint="--env")
        out[key] = val
    return out


@policy.command("set")
@click.argument("team")
@click.option("--file", "file", type=click.Path(dir_okay=False, path_type=Path),
              help="the whole policy (YAML or JSON); the flags below change it. Without it, the flags change "
                   "the policy in force")
@click.option("--env", "envs", multiple=True, metavar="KEY=VALUE", help="a default env var (repeat)")
@click.option("--allow", "allow", multiple=True, metavar="ACCEL",
              help="an accelerator the team may use (repeat, or comma-separated)")
@click.option("--max-price-per-hour", type=float, help="dollars per hour per job (price per node x nodes)")
@click.option("--max-nodes", type=int, help="nodes per job")
@click.option("--max-gpus-running", type=int, help="GPUs of the team's attempts at once")
@click.option("--retention-days", type=float, help="days before checkpoints move to the cold tier")
@click.option("--carbon-price-per-tonne", type=float,
              help="dollars per tonne of CO2e placement weighs, for jobs that do not say")
@click.option("--unset", "unset", multiple=True, type=click.Choice(FIELDS), help="remove a rule (repeat)")
@click.option("--json", "as_json", is_flag=True)
def policy_set(team: str, file: Path | None, envs: tuple[str, ...], allow: tuple[str, ...],
               max_price_per_hour: float | None, max_nodes: int | None, max_gpus_running: int | None,
               retention_days: float | None, carbon_price_per_tonne: float | None, unset: tuple[str, ...],
               as_json: bool) -> None:
    """Set TEAM's defaults and limits (SPOTBROKER_ADMIN_TOKEN)."""
    c = admin_client()
    if file is not None:
        doc = _read_file(file)
    else:
        doc = call(lambda: c._request("GET", f"/v1/teams/{team}/policy").json())
        doc.pop("team", None)
    for key in unset:
        doc.pop(key, None)
    if envs:
        doc["envs"] = {**(doc.get("envs") or {}), **_pairs(envs)}
    if allow:
        doc["allowed_accelerators"] = [name.strip() for value in allow for name in value.split(",") if name.strip()]
    for key, value in (("max_price_per_hour", max_price_per_hour), ("max_nodes", max_nodes),
                       ("max_gpus_running", max_gpus_running), ("checkpoint_retention_days", retention_days),
                       ("carbon_price_per_tonne", carbon_price_per_tonne)):
        if value is not None:
            doc[key] = value
    try:
        got = call(lambda: c._request("PUT", f"/v1/teams/{team}/policy", json=doc).json())
    except click.ClickException as exc:
        raise click.ClickException(f"{file}: {exc.message}" if file else exc.message) from None
    _print(got, as_json)


@policy.command("show")
@click.argument("team", required=False)
@click.option("--json", "as_json", is_flag=True)
def policy_show(team: str | None, as_json: bool) -> None:
    """Show TEAM's defaults and limits (default: your token's team)."""
    c = admin_client() if team else team_client()
    if team is None:
        team = call(lambda: c._request("GET", "/v1/whoami").json())["name"]
    _print(call(lambda: c._request("GET", f"/v1/teams/{team}/policy").json()), as_json)


def _print(got: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(got, indent=2))
        return
    t = table("RULE", "VALUE", title=f"team {got['team']}")
    for key in FIELDS:
        value = got.get(key)
        if value in (None, {}, []) and key != "allowed_accelerators":
            continue
        if key == "envs":
            value = " ".join(f"{k}={v}" for k, v in value.items())
        elif key == "allowed_accelerators":
            value = ", ".join(value) if value is not None else "any"
        elif key == "max_price_per_hour":
            value = f"${value:g}/h per job"
        elif isinstance(value, dict):
            value = json.dumps(value)
        t.add_row(key, str(value))
    show_table(t)
