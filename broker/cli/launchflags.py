"""SkyPilot's launch flags on `spotbroker submit` (`--env`, `--secret`,
`--env-file`, `--name`, `--gpus`, `--num-nodes`, `--use-spot/--no-use-spot`,
`--infra`, `-y`), read as `sky launch` reads them: `--env KEY` takes the
value of $KEY in the caller's environment. What they do to the job is
`broker.jobs.overrides`."""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from spotbroker.broker.jobs.overrides import LaunchFlags

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_DOTENV_RE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def _variable(kind: str) -> Callable[[click.Context, click.Parameter, tuple[str, ...]], list[tuple[str, str]]]:
    def parse(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[tuple[str, str]]:
        out = []
        for text in values:
            key, sep, value = text.partition("=")
            if not _NAME_RE.match(key):
                raise click.BadParameter(f"{key!r} is not a variable name: give KEY=VALUE or KEY", param=param)
            if not sep:
                if key not in os.environ:
                    raise click.BadParameter(f"{key} is not set in your environment: give {key}=VALUE, or set "
                                             f"${key} first", param=param)
                value = os.environ[key]
            out.append((key, value))
        return out
    return parse


def _env_file(ctx: click.Context, param: click.Parameter, value: Path | None) -> dict[str, str]:
    """A dotenv file: KEY=VALUE lines (`export` allowed, `#` comments, quoted
    values); a line that is none of these is named with its number."""
    if value is None:
        return {}
    try:
        text = value.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"{value}: {getattr(exc, 'strerror', None) or exc}", param=param) from None
    out = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _DOTENV_RE.match(line)
        if not m:
            raise click.BadParameter(f"{value}:{number}: not KEY=VALUE", param=param)
        raw = m[2]
        if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
            raw = raw[1:-1]
        elif " #" in raw:
            raw = raw.split(" #", 1)[0].rstrip()
        out[m[1]] = raw
    return out


def options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The launch flags, as `sky launch` spells them."""
    for decorator in reversed([
        click.option("--name", "-n", default=None, help="the job's name (overrides the file's)"),
        click.option("--gpus", default=None, metavar="NAME[:COUNT]",
                     help="accelerators for every resource set, e.g. A100:8 ('none' removes them)"),
        click.option("--infra", default=None, metavar="CLOUD[/REGION[/ZONE]]",
                     help="where every resource set may run: aws, gcp/us-central1, k8s/CONTEXT..."),
        click.option("--num-nodes", type=click.IntRange(min=1), default=None, help="nodes to run on"),
        click.option("--use-spot/--no-use-spot", default=None,
                     help="spot or on-demand for every resource set (a file without use_spot: on-demand)"),
        click.option("--env", "envs", multiple=True, callback=_variable("env"), metavar="KEY[=VALUE]",
                     help="an environment variable (repeatable); KEY alone takes your $KEY"),
        click.option("--env-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     callback=_env_file, default=None,
                     help="a dotenv file of variables; --env wins; a name the file declares under secrets "
                          "is filled in as a secret"),
        click.option("--secret", "secrets", multiple=True, callback=_variable("secret"), metavar="KEY[=VALUE]",
                     help="a secret (repeatable), never shown by the API; KEY alone takes your $KEY"),
        click.option("-y", "--yes", is_flag=True, help="accepted as in `sky launch`: submit asks nothing"),
    ]):
        fn = decorator(fn)
    return fn


def flags(name: str | None, gpus: str | None, infra: str | None, num_nodes: int | None, use_spot: bool | None,
          envs: list[tuple[str, str]], env_file: dict[str, str], secrets: list[tuple[str, str]]) -> LaunchFlags:
    return LaunchFlags(name=name, num_nodes=num_nodes, gpus=gpus, infra=infra, use_spot=use_spot,
                       envs=list(envs), secrets=list(secrets), env_file=env_file)
