"""The `teams` group. `teams list`, `teams token rotate|revoke` and the
policy and storage commands go through a running broker (SPOTBROKER_URL,
SPOTBROKER_ADMIN_TOKEN, or a team's token for its own); `teams create` may
work on the broker's own database instead, so the first team can exist
before any token does. Kept apart from cli/server.py, so that `serve`
imports no HTTP client."""
from __future__ import annotations

import json

import click

from spotbroker.broker.cli.access import admin_client, variable
from spotbroker.broker.cli.jobs import call
from spotbroker.broker.cli.output import show, table, when


@click.group()
def teams() -> None:
    """Teams and their tokens: create (through the broker named by SPOTBROKER_URL
    with SPOTBROKER_ADMIN_TOKEN, else on this host's broker database), list
    and token rotate/revoke (through the broker, SPOTBROKER_ADMIN_TOKEN)."""


@teams.command("create")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="print {team, token} as JSON")
def teams_create(name: str, as_json: bool) -> None:
    """Create a team; its token is printed alone on the last line. With
    SPOTBROKER_URL and SPOTBROKER_ADMIN_TOKEN exported, through that broker;
    otherwise in this host's broker database (the first team of a broker
    that has no admin token yet)."""
    if variable("URL") and variable("ADMIN_TOKEN"):
        made = call(lambda: admin_client().create_team(name))
        team_name, token = made["team"], made["token"]
    else:
        from spotbroker.broker import auth
        from spotbroker.broker.cli.server import _ready_engine
        from spotbroker.broker.store.db import make_session_factory, transaction

        engine = _ready_engine()
        try:
            with transaction(make_session_factory(engine)) as session:
                team, token = auth.create_team(session, name)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        team_name = team.name
        if variable("URL"):  # the shell names a broker that may keep its teams elsewhere: say where this went
            click.echo(f"spotbroker: made in this host's database ({engine.url.render_as_string()}); if the "
                       f"broker at {variable('URL')} uses another, export SPOTBROKER_ADMIN_TOKEN to make the "
                       "team through it", err=True)
    if as_json:
        click.echo(json.dumps({"team": team_name, "token": token}))
    else:
        click.echo(f"created team {team_name}; its token (shown once):", err=True)
        click.echo(token)


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


def _add_commands() -> None:
    from spotbroker.broker.cli.policy import policy
    from spotbroker.broker.cli.storage import storage

    for command in (policy, teams_list, token, storage):
        teams.add_command(command)


_add_commands()
