"""The `spotbroker` command line.

Commands are loaded lazily from the table below, so `spotbroker agent run`
on a GPU node imports neither the broker's database stack nor the API, and
each command starts fast.
"""
from __future__ import annotations

import importlib

import click

# name -> "module:attribute" of a click command or group
COMMANDS: dict[str, str] = {
    "simulate": "spotbroker.broker.sim.cli:simulate",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as exc:
            if (exc.name or "").startswith("spotbroker"):
                raise
            return _missing_dependency(name, exc.name or "a dependency")


def _missing_dependency(name: str, missing: str) -> click.Command:
    """A placeholder that lists in --help and explains itself when run."""

    def fail() -> None:
        raise click.ClickException(
            f"'spotbroker {name}' needs the broker's dependencies ({missing} is not installed): "
            "pip install 'spotbroker[broker]'"
        )

    return click.Command(name, callback=fail, help=f"(needs spotbroker[broker]: {missing} is missing)")


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="spotbroker")
def cli() -> None:
    """spotbroker: train on spot GPUs at the lowest expected cost."""


def main() -> None:
    cli()
