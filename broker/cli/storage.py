"""`spotbroker teams storage`: the buckets a team's jobs may mount, over
HTTP (the admin's token sets them; a team's token reads its own)."""
from __future__ import annotations

import json

import click

from spotbroker.broker.cli.access import admin_client
from spotbroker.broker.cli.jobs import call


@click.command("storage")
@click.argument("team")
@click.option("--bucket", "rw", multiple=True, metavar="URI", help="a prefix its jobs may read and write (repeat)")
@click.option("--read-only", "ro", multiple=True, metavar="URI", help="a prefix its jobs may only read (repeat)")
@click.option("--clear", is_flag=True, help="allow none (its own storage stays its own)")
@click.option("--json", "as_json", is_flag=True)
def storage(team: str, rw: tuple[str, ...], ro: tuple[str, ...], clear: bool, as_json: bool) -> None:
    """Show, or with --bucket/--read-only/--clear replace, the bucket prefixes TEAM's jobs may mount.

    The list given replaces the whole list: name every prefix the team keeps."""
    c = admin_client()  # the admin sets any team's list and reads any; a team token reads its own
    if clear and (rw or ro):
        raise click.ClickException("--clear allows none: give it alone, or give the whole list without it")
    if clear or rw or ro:
        got = call(c.set_storage, team, [{"uri": u, "read_only": False} for u in rw]
                   + [{"uri": u, "read_only": True} for u in ro])
    else:
        got = call(c.storage, team)
    if as_json:
        click.echo(json.dumps(got, indent=2))
        return
    click.echo(f"team {got['team']}: its own storage {got['own']} (buckets by name under buckets/)")
    if not got["buckets"]:
        click.echo("  no other bucket")
    for bucket in got["buckets"]:
        click.echo(f"  {bucket['uri']}  {'read only' if bucket['read_only'] else 'read and write'}")
