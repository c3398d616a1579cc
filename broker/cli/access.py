"""Which token a command sends. A team's commands send SPOTBROKER_TOKEN (the
admin's when only that is set); the admin's commands send
SPOTBROKER_ADMIN_TOKEN whenever it is set, so a user with both exported
never has an admin command refused for the team token it sent instead."""
from __future__ import annotations

import click

from spotbroker.broker.cli.client import Client
from spotbroker.broker.settings import get_settings


def team_client() -> Client:
    settings = get_settings()
    token = settings.token or settings.admin_token
    if token is None:
        raise click.ClickException("set SPOTBROKER_TOKEN to a team token (or SPOTBROKER_ADMIN_TOKEN)")
    return Client(settings.url, token.get_secret_value())


def admin_client() -> Client:
    settings = get_settings()
    token = settings.admin_token or settings.token  # a team token: the broker answers what it may not do
    if token is None:
        raise click.ClickException("this needs the admin token: set SPOTBROKER_ADMIN_TOKEN")
    return Client(settings.url, token.get_secret_value())

