"""How much of a job's spec its node can hand to `execve`, checked at
submission.

A node starts the job's command with the job's whole environment, and its
commands as one argument (`bash -c "setup; run"`). Linux refuses an
argument or an environment string over 128 KiB (MAX_ARG_STRLEN), and all
of them together over a quarter of the stack limit (2 MiB by default), with
E2BIG: the node then dies before the job starts. So the spec's environment
(`envs` and `secrets`, as the `NAME=value` strings the process gets) and each
command are bounded well below both, leaving room for what the broker adds
(ids, prefixes, credentials, the agent's arguments). A spec stored before
these bounds that still breaks them fails its launch, saying why.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spotbroker.broker.jobs.spec import JobSpec

MAX_ENV_BYTES = 64 * 1024      # envs and secrets together, as NAME=value strings
MAX_COMMAND_BYTES = 60 * 1024  # each of setup, run, preflight.run: setup and either stay under 128 KiB

_LARGE = "put large data in the workdir or a file mount, and read it from there"


def environment_bytes(spec: JobSpec) -> int:
    """The job's `envs` and `secrets` as a process's environment takes them (NAME=value and a NUL)."""
    pairs = [*spec.envs.items(), *spec.secret_values().items()]
    return sum(len(name.encode()) + len(value.encode()) + 2 for name, value in pairs)


def size_errors(spec: JobSpec) -> list[dict[str, str]]:
    """The fields over what a node can start, as field errors (none when it fits)."""
    errors = []
    size = environment_bytes(spec)
    if size > MAX_ENV_BYTES:
        field = "envs" if spec.envs or not spec.secrets else "secrets"
        errors.append({"field": field, "message": f"envs and secrets together take {size} bytes as the job's "
                       f"environment; at most {MAX_ENV_BYTES}: {_LARGE}"})
    commands = [("setup", spec.setup), ("run", spec.run)]
    if spec.preflight is not None:  # (its pre-flight's run is launched as the job's is, in its place)
        commands.append(("preflight.run", spec.preflight.run))
    for field, command in commands:
        size = len((command or "").encode())
        if size > MAX_COMMAND_BYTES:
            errors.append({"field": field, "message": f"{size} bytes; at most {MAX_COMMAND_BYTES}: {_LARGE} "
                           "(a script in the workdir, say)"})
    return errors
