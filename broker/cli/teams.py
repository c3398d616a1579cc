"""`teams list` and `teams token rotate|revoke`: the admin's team commands
that go through a running broker (SPOTBROKER_URL, SPOTBROKER_ADMIN_TOKEN).
`teams create` works on the broker's own database (cli/server.py), so the
first team can exist before any token does."""
from __future__ import annotations

import json

import click

from spotbroker.broker.cli.access import admin_client
from spotbroker.broker.cli.jobs import call
from spotbroker.broker.cli.output import show, table, when


@click.command("list")
@click.option("--json", "as_json", is_flag=True)
def teams_list(as_json: bool) -> None:
    """List the teams (SPOTBROKER_ADMIN_TOKEN)."""
    found = call(lambda: admin_client()._request("GET", "/v1/teams").json())
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    t = table("ID", "NAME", "CREATED")
    for team in found:
        t.add_row(str(team["id"]), team["name"], when(team["created_at"]))
    show(t)


@click.group("token")
def token() -> None:
    """Replace or revoke a team's API tokens."""


@token.command("rotate")
@click.argument("team")
@click.option("--json", "as_json", is_flag=True, help="print {team, token} as JSON")
def token_rotate(team: str, as_json: bool) -> None:
    """Give TEAM one new token and stop its old ones at once; the new token
    is printed alone on the last line (shown once). The admin's token, or
    the team's own."""
    out = call(lambda: admin_client()._request("POST", f"/v1/teams/{team}/tokens/rotate").json())
    if as_json:
        click.echo(json.dumps(out))
        return
    click.echo(f"team {out['team']}: its old tokens no longer work; its new token (shown once):", err=True)
    click.echo(out["token"])


@token.command("revoke")
@click.argument("team")
@click.option("--json", "as_json", is_flag=True)
def token_revoke(team: str, as_json: bool) -> None:
    """Revoke every token of TEAM (SPOTBROKER_ADMIN_TOKEN): it has none that
    works until `spotbroker teams token rotate TEAM`. Its jobs keep running."""
    out = call(lambda: admin_client()._request("POST", f"/v1/teams/{team}/tokens/revoke").json())
    if as_json:
        click.echo(json.dumps(out))
        return
    click.echo(f"team {out['team']}: {out['revoked']} token(s) revoked; "
               f"it has no working token until 'spotbroker teams token rotate {out['team']}'")
