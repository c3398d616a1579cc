"""The `spotbroker` command line.

Commands are loaded lazily from the table below, so `spotbroker agent run`
on a GPU node imports neither the broker's database stack nor the API, and
each command starts fast.
"""
from __future__ import annotations

import importlib
import sys

import click

# name -> ("module:attribute" of a click command or group, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("spotbroker.broker.cli.server:serve", "Run the broker: REST API and reconciler."),
    "db": ("spotbroker.broker.cli.server:db", "Database schema (upgrade, ready, current), key rotation (reseal)."),
    "teams": ("spotbroker.broker.cli.teams:teams", "Teams: create, list, token rotate/revoke, policy."),
    "submit": ("spotbroker.broker.cli.jobs:submit", "Submit a job from a JSON or YAML file."),
    "jobs": ("spotbroker.broker.cli.jobs:list_jobs", "List your team's jobs."),
    "job": ("spotbroker.broker.cli.jobs:show_job", "Show one job: attempts, cost, events."),
    "logs": ("spotbroker.broker.cli.jobs:logs", "Print (or follow) a job's output."),
    "cancel": ("spotbroker.broker.cli.jobs:cancel", "Cancel a job."),
    "checkpoints": ("spotbroker.broker.cli.jobs:checkpoints", "List a job's committed checkpoints."),
    "metrics": ("spotbroker.broker.cli.metrics:metrics", "A job's reported metrics by step, and its early stop."),
    "simulate-preemption": ("spotbroker.broker.cli.jobs:simulate_preemption",
                            "Send a simulated preemption notice (local launcher)."),
    "costs": ("spotbroker.broker.cli.money:costs", "A team's spend from the ledger; --group-by day|job|..."),
    "budget": ("spotbroker.broker.cli.money:budget", "Read or set a team's budget."),
    "alerts": ("spotbroker.broker.cli.alerts:alerts", "Budget alerts, newest first; --state open|resolved."),
    "silences": ("spotbroker.broker.cli.alerts:silences", "Silences on budget alerts: list, add, expire."),
    "prices": ("spotbroker.broker.cli.prices:prices", "GPU prices across the clouds; --history, --refresh."),
    "demo": ("spotbroker.broker.cli.demo:demo", "Run the local demo end to end."),
    "simulate": ("spotbroker.broker.sim.cli:simulate", "Replay a placement policy over spot traces."),
    "agent": ("spotbroker.agent.cli:agent", "Node agent: run a trainer under preemption watch."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # From the table, so that --help imports nothing.
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_) for name, (_, help_) in COMMANDS.items()])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr = COMMANDS[name][0].split(":")
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
    try:
        cli()
    except Exception as exc:  # a bad SPOTBROKER_* variable: named, without a traceback
        from sqlalchemy.exc import OperationalError

        from spotbroker.broker.cli.badsettings import explain

        if isinstance(exc, OperationalError):  # the database out of reach: a line, not 135 of traceback
            from spotbroker.broker.store.db import driver_said

            click.echo(f"Error: the database does not answer (SPOTBROKER_DATABASE_URL): {driver_said(exc)}", err=True)
            sys.exit(1)
        message = explain(exc)
        if message is None:
            raise
        click.echo(f"Error: {message}", err=True)
        sys.exit(2)
