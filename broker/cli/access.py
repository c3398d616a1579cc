"""Where a command finds the broker and which token it sends.

A team's commands send SPOTBROKER_TOKEN (the admin's when only that is set);
the admin's commands send SPOTBROKER_ADMIN_TOKEN whenever it is set, so a
user with both exported never has an admin command refused for the team
token it sent instead.

The three variables are read as the broker's settings read theirs
(broker/settings.py: the environment over a `.env` file in the working
directory, names in any case), without loading those settings: a client
command needs three strings, not the broker's 80 validated fields (which
cost each command a third of its start-up, and would fail it for a server
setting it never uses).
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

import click

from spotbroker.broker.cli.client import Client

DEFAULT_URL = "http://127.0.0.1:8000"
ENV_FILE = ".env"


def variable(name: str) -> str | None:
    """SPOTBROKER_{name}: the environment's, else the `.env` file's; unset or empty is None."""
    return _variables().get(f"SPOTBROKER_{name}".upper()) or None


@functools.cache
def _variables() -> dict[str, str]:
    """Both sources, read once per command, names upper-cased; the environment wins."""
    found: dict[str, str] = {}
    if Path(ENV_FILE).is_file():
        from dotenv import dotenv_values  # pydantic-settings reads it with this too

        found = {k.upper(): v for k, v in dotenv_values(ENV_FILE).items() if v is not None}
    return {**found, **{k.upper(): v for k, v in os.environ.items()}}


def url() -> str:
    return variable("URL") or DEFAULT_URL


def token_client() -> Client:
    """The team's token, and no other."""
    token = variable("TOKEN")
    if token is None:
        raise click.ClickException("set SPOTBROKER_TOKEN to a team token (spotbroker teams create NAME)")
    return Client(url(), token)


def team_client() -> Client:
    token = variable("TOKEN") or variable("ADMIN_TOKEN")
    if token is None:
        raise click.ClickException("set SPOTBROKER_TOKEN to a team token (or SPOTBROKER_ADMIN_TOKEN)")
    return Client(url(), token)


def reader_client(team: str | None) -> Client:
    """For a read of one named team: the admin token when it is set (a team's
    token reads its own team only, and both may be exported at once); else
    the team's token."""
    return admin_client() if team and variable("ADMIN_TOKEN") else team_client()


def admin_client() -> Client:
    token = variable("ADMIN_TOKEN") or variable("TOKEN")  # a team token: the broker answers what it may not do
    if token is None:
        raise click.ClickException("this needs the admin token: set SPOTBROKER_ADMIN_TOKEN")
    return Client(url(), token)
