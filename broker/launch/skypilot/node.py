"""What a SkyPilot node runs for an attempt: the generated `setup` and `run`,
its environment, its secrets and its file mounts.

The node gets the broker's own wheelhouse (`wheel.py`) by `file_mounts`
and installs it in `setup`, with no package index, into a virtualenv of
its own before the user's setup runs (whose `pip install` then lands in
that environment, as the local launcher's jobs share the jobs' interpreter).
`run` fetches the job's uploaded code from the team's storage prefix into
a fresh working directory, checks its sha256 (`agent/code.py`), and runs the
user's command under the agent on every node:
`python -I -m spotbroker.agent.cli run -- bash -c RUN`.

Nothing of the broker's host reaches the node but the wheelhouse: the
job's code is the upload (never a host path), and the node's environment is
the job's `envs` plus the attempt's own variables. What must stay secret
(the agent's token, the node's storage credentials, the user's `secrets`)
goes in SkyPilot's `secrets`, which SkyPilot keeps out of its logs and
status (`to_yaml_config()` prints them in clear: never store that).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from spotbroker.agent import protocol
from spotbroker.agent.mounts import encode
from spotbroker.broker.launch.base import LaunchRequest
from spotbroker.broker.pricing import gcp_n1

# On the node, under the SSH user's home (SkyPilot expands `~` in file_mounts targets).
WHEELHOUSE = "~/.spotbroker/wheels"
VENV = "$HOME/.spotbroker/venv"
NODE_ROOT = "$HOME/.spotbroker/attempts"
# The interpreters the agent runs on, newest first (it needs Python >= 3.11).
PYTHONS = ("python3.13", "python3.12", "python3.11", "python3")
# Variables of the attempt that are secret: SkyPilot `secrets`, never `envs`.
SECRET_NAMES = (protocol.ENV_AGENT_TOKEN, protocol.ENV_STORAGE_CREDENTIALS)


@dataclass(frozen=True)
class NodeProgram:
    setup: str
    run: str
    envs: dict[str, str]
    secrets: dict[str, str]
    file_mounts: dict[str, str]


def setup_script(user_setup: str | None, with_mounts: bool = False) -> str:
    """Install the shipped wheelhouse (no index), place the job's file mounts
    that SkyPilot does not (uploads, `agent/mounts.py`), then the user's setup."""
    pick = " || ".join(f"command -v {p}" for p in PYTHONS)
    lines = [
        "set -e",
        f'SB_PYTHON="$({pick})"',
        f'"$SB_PYTHON" -m venv --system-site-packages "{VENV}"',
        f'"{VENV}/bin/python" -m pip install --quiet --disable-pip-version-check --no-index '
        f'--find-links {WHEELHOUSE} spotbroker',
        f'export PATH="{VENV}/bin:$PATH"',
    ]
    if with_mounts:
        lines.append(f'"{VENV}/bin/python" -I -m spotbroker.agent.mounts --no-cloud-buckets')
    if user_setup:
        lines += ["set +e", f"( {user_setup}\n)"]  # the user's own shell: its exit status is setup's
    return "\n".join(lines) + "\n"


def run_script(user_run: str, with_code: bool, max_log_bytes: int = 0) -> str:
    """Fetch the job's code into a fresh working directory, then run the
    user's command under the agent (on every node), its output bounded as
    the broker bounds the log it keeps (0: no bound)."""
    node = f'{NODE_ROOT}/"${protocol.ENV_ATTEMPT_ID}"/node-"$SKYPILOT_NODE_RANK"'
    lines = [
        "set -e",
        f'export PATH="{VENV}/bin:$PATH"',
        f"SB_NODE={node}",
        'rm -rf "$SB_NODE/workdir"',
        'mkdir -p "$SB_NODE/agent" "$SB_NODE/workdir"',
    ]
    if with_code:
        fetch = ("import sys, pathlib; from spotbroker.agent.code import fetch_code; "
                 "fetch_code(sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]))")
        lines.append(f'python -I -c {shlex.quote(fetch)} "${protocol.ENV_CODE_URI}" "${protocol.ENV_CODE_SHA256}" '
                     '"$SB_NODE/workdir"')
    # Isolated (-I): the job's PYTHONPATH and modules are its trainer's, never
    # imported by the agent (a job's random.py on its PYTHONPATH failed it).
    lines += [
        # where SkyPilot puts a task's workdir (recipes `cd ~/sky_workdir`), unless the image has one
        '[ -d "$HOME/sky_workdir" ] && [ ! -L "$HOME/sky_workdir" ] || ln -sfn "$SB_NODE/workdir" "$HOME/sky_workdir" '
        '|| true',
        'cd "$SB_NODE/workdir"',
        f"exec python -I -m spotbroker.agent.cli run --max-log-bytes {int(max_log_bytes)} "
        f'--work-dir "$SB_NODE/agent" -- bash -c {shlex.quote(user_run)}',
    ]
    return "\n".join(lines) + "\n"


def node_program(request: LaunchRequest, wheelhouse: str, credentials: dict[str, str] | None = None,
                 user_secrets: dict[str, str] | None = None, max_log_bytes: int = 0) -> NodeProgram:
    """Everything the node is given for `request`. `credentials`: the node's
    own storage credentials (scoped to the job's prefix), if any, under
    spotbroker's own name: the user's `secrets` (their own AWS_* keys, say)
    reach their process unchanged, and the node's instance identity stays
    theirs, since no standard variable shadows it."""
    p = request.placement
    envs = {**request.envs,
            protocol.ENV_CLOUD: p.cloud, protocol.ENV_REGION: p.region or "",
            protocol.ENV_ZONE: p.zone or p.zone_id or "",
            protocol.ENV_INSTANCE_TYPE: gcp_n1.machine_type(p.instance_type or "")}
    secrets = dict(user_secrets or {})
    for name, value in request.extra_env.items():
        (secrets if name in SECRET_NAMES else envs)[name] = value
    secrets.update(credentials or {})
    if request.code is not None:
        envs[protocol.ENV_CODE_URI] = request.code.uri
        envs[protocol.ENV_CODE_SHA256] = request.code.sha256
    if request.mounts:
        envs[protocol.ENV_MOUNTS] = encode(list(request.mounts))
    return NodeProgram(setup=setup_script(request.setup, bool(request.mounts)),
                       run=run_script(request.run, request.code is not None, max_log_bytes),
                       envs=envs, secrets=secrets, file_mounts={WHEELHOUSE: wheelhouse})
