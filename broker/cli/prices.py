"""`spotbroker prices`: current GPU offers across the clouds, one offer's
history (both from a running broker, over HTTP), or one refresh of the
price sources run here against the broker's database (`--refresh`)."""
from __future__ import annotations

import json
from typing import Any

import click

from spotbroker.broker.cli.access import token_client
from spotbroker.broker.cli.jobs import call


def _shape(shape: str | None) -> tuple[str | None, float | None]:
    if not shape:
        return None, None
    name, _, count = shape.partition(":")
    try:
        return name, float(count) if count else None
    except ValueError:
        raise click.BadParameter(f"{shape!r}: use NAME or NAME:COUNT, e.g. A100:8", param_hint="SHAPE") from None


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


@click.command("prices")
@click.argument("shape", required=False)
@click.option("--cloud", type=click.Choice(["aws", "gcp", "azure"]))
@click.option("--region")
@click.option("--on-demand", is_flag=True, help="rank by the on-demand price")
@click.option("--max-price", type=float, help="$/h cap on the ranked price")
@click.option("--limit", default=20, show_default=True)
@click.option("--history", is_flag=True, help="one offer's series: needs --cloud, --zone, --instance-type")
@click.option("--zone", help="with --history: zone, zone id, or region (Azure)")
@click.option("--instance-type")
@click.option("--days", default=90.0, show_default=True, help="with --history: how far back")
@click.option("--refresh", is_flag=True, help="refresh the price sources now (here, on the broker's database)")
@click.option("--source", "sources", multiple=True, help="with --refresh: only these sources (repeatable)")
@click.option("--json", "as_json", is_flag=True)
def prices(shape: str | None, cloud: str | None, region: str | None, on_demand: bool, max_price: float | None,
           limit: int, history: bool, zone: str | None, instance_type: str | None, days: float, refresh: bool,
           sources: tuple[str, ...], as_json: bool) -> None:
    """GPU offers across AWS, GCP and Azure, cheapest first (e.g. `spotbroker prices A100:8`)."""
    if refresh:
        _refresh(list(sources), as_json)
    elif history:
        if not (cloud and zone and instance_type):
            raise click.UsageError("--history needs --cloud, --zone and --instance-type")
        params = {"cloud": cloud, "zone": zone, "instance_type": instance_type, "days": days}
        if region:
            params["region"] = region
        body = call(lambda: token_client()._request("GET", "/v1/prices/history", params=params).json())
        _print_history(body, as_json)
    else:
        accelerator, count = _shape(shape)
        params: dict[str, Any] = {"spot": str(not on_demand).lower(), "limit": limit}
        for key, value in (("accelerator", accelerator), ("count", count), ("cloud", cloud), ("region", region),
                           ("max_price", max_price)):
            if value is not None:
                params[key] = value
        body = call(lambda: token_client()._request("GET", "/v1/prices", params=params).json())
        _print_offers(body, as_json)
        if not body["offers"] and not as_json:
            asked = ", ".join(f"{k} {v}" for k, v in params.items() if k not in ("spot", "limit"))
            click.echo(f"(no offer matches {asked or 'these filters'}: `spotbroker prices` with fewer "
                       "filters lists what there is)", err=True)


def _print_offers(body: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    from rich.table import Table

    from spotbroker.broker.cli.output import console

    table = Table("CLOUD", "REGION", "ZONE", "INSTANCE", "GPUS", "VCPUS", "MEM GiB", "SPOT $/h", "ON-DEMAND $/h",
                  "SAVING", "AGE", "SOURCE", "RISK")
    for o in body["offers"]:
        saving = "-" if o["saving"] is None else f"{o['saving']:.0%}"
        risk = "-" if o["risk"] is None else f"{o['risk']:.0%}/mo"
        if o.get("age_class") == "snapshot":  # the bundled file: its own date, not when it was re-read
            age = f"snapshot {o['snapshot_date'] or '(date unknown)'}"
        else:
            age = _age(o["age_seconds"]) + (" stale" if o["stale"] else "")
        table.add_row(o["cloud"], o["region"], o["zone"] or o["zone_id"] or "-", o["instance_type"],
                      f"{o['accelerator']}:{o['accelerator_count']:g}" if o["accelerator"] else "-",
                      f"{o['vcpus'] or 0:g}",
                      f"{o['memory_gib'] or 0:g}", _money(o["spot_price"]), _money(o["on_demand_price"]), saving,
                      age, o["source"], risk)
    console().print(table)
    if body["offers"] and all(o["risk"] is None for o in body["offers"]):
        click.echo("(RISK: no interruption figures for these offers; they come from the live sources "
                   "aws-advisor and azure (its eviction rates), see docs/prices.md)")
    if body.get("next_cursor"):
        click.echo("(more: raise --limit, or page with the API's cursor)")


def _print_history(body: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    click.echo(f"{body['cloud']} {body['zone']} {body['instance_type']}: {len(body['samples'])} price changes")
    for s in body["samples"]:
        click.echo(f"  {s['observed_at'][:19].replace('T', ' ')}  spot {_money(s['spot_price'])}  "
                   f"on-demand {_money(s['on_demand_price'])}  ({s['source']})")


def _refresh(names: list[str], as_json: bool) -> None:
    from spotbroker.broker.pricing.settings import KNOWN_SOURCES, get_pricing_settings
    from spotbroker.broker.pricing.sources import build_sources
    from spotbroker.broker.pricing.tracker import PriceTracker
    from spotbroker.broker.settings import get_settings
    from spotbroker.broker.store import migrate
    from spotbroker.broker.store.db import make_engine, make_session_factory

    unknown = [n for n in names if n not in KNOWN_SOURCES]
    if unknown:
        raise click.BadParameter(f"unknown source(s) {unknown}; known: {', '.join(KNOWN_SOURCES)}",
                                 param_hint="--source")
    settings, pricing = get_settings(), get_pricing_settings()
    engine = make_engine(settings.sqlalchemy_url)
    try:
        if not migrate.is_current(engine):
            raise click.ClickException("the database schema is behind: run 'spotbroker db upgrade'")
        factory = make_session_factory(engine)
        tracker = PriceTracker(factory, build_sources(pricing, names or None, factory), pricing)
        results, outcome = {}, {}
        for name in tracker.sources:
            result = tracker.refresh(name, force=True)
            results[name] = result
            outcome[name] = ("reachable", "") if result is not None else tracker.why_not.get(name, ("failed", ""))
            if as_json:
                continue
            if result is None:
                kind, detail = outcome[name]
                click.echo(f"{name}: {kind}, not refreshed ({detail}); its offers keep their last prices")
                continue
            click.echo(result.summary())
            for line in result.changes:
                click.echo(f"  {line}")
    finally:
        engine.dispose()
    if as_json:
        click.echo(json.dumps({n: {"outcome": outcome[n][0], "error": outcome[n][1] or None} if r is None else {
            "outcome": "reachable", "new": r.new, "changed": r.changed, "unchanged": r.unchanged,
            "unlisted": r.unlisted, "samples": r.samples, "changes": r.changes,
            "dropped_or_fixed": dict(r.quality.counts)} for n, r in results.items()}, indent=2))
        return
    reached = [n for n in results if outcome[n][0] == "reachable"]
    missed = [n for n in results if outcome[n][0] != "reachable"]
    click.echo(f"reachable: {', '.join(reached) or 'none'}; not: {', '.join(missed) or 'none'}")
