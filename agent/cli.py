"""`spotbroker agent ...`: the node agent's commands.

Only click and the protocol module are imported here; the supervisor and its
HTTP client load when `run` runs, so that the agent starts fast on a node
that has nothing but the agent installed.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from spotbroker.agent.protocol import (
    ENV_AGENT_TOKEN,
    ENV_AGENT_TOKEN_FD,
    ENV_ATTEMPT_ID,
    ENV_BROKER_URL,
    ENV_CLOUD,
    ENV_JOB_ID,
    ENV_METADATA_URL,
    ENV_NOTICE_WINDOW,
    ENV_TRAINER_ENV_FD,
)

# The agent's own settings (not part of protocol.py: no broker sets them).
ENV_WORK_DIR = "SPOTBROKER_AGENT_DIR"  # outbox, trainer log, control dirs
ENV_HEARTBEAT = "SPOTBROKER_HEARTBEAT_SECONDS"
ENV_POLL = "SPOTBROKER_POLL_SECONDS"
ENV_CREDENTIALS_LEAD = "SPOTBROKER_CREDENTIALS_LEAD_SECONDS"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def agent() -> None:
    """The node agent: supervise a trainer, watch for preemption, report to the broker."""


@agent.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--broker-url", envvar=ENV_BROKER_URL, show_envvar=True,
              help="Where to report (none: events stay on disk).")
@click.option("--token", envvar=ENV_AGENT_TOKEN, show_envvar=True, help="This attempt's agent token.")
@click.option("--token-fd", envvar=ENV_AGENT_TOKEN_FD, show_envvar=True, type=click.IntRange(min=0), default=None,
              help="Read the token from this file descriptor instead (then closed): it is then in no "
                   "process's environment.")
@click.option("--trainer-env-fd", envvar=ENV_TRAINER_ENV_FD, show_envvar=True, type=click.IntRange(min=0),
              default=None, help="Read variables for the trainer only (a JSON object) from this file descriptor "
                                 "(then closed): the local launcher's, kept out of the agent's own environment.")
@click.option("--job-id", envvar=ENV_JOB_ID, show_envvar=True)
@click.option("--attempt-id", envvar=ENV_ATTEMPT_ID, show_envvar=True)
@click.option("--cloud", envvar=ENV_CLOUD, show_envvar=True, help="aws, gcp, azure, k8s or local (default: detect).")
@click.option("--metadata-url", envvar=ENV_METADATA_URL, show_envvar=True,
              help="The metadata service to watch instead of the cloud's own (e.g. the simulator).")
@click.option("--work-dir", envvar=ENV_WORK_DIR, show_envvar=True, type=click.Path(file_okay=False, path_type=Path),
              help="Outbox, trainer log and control dirs (default: a fresh temporary dir).")
@click.option("--heartbeat-seconds", envvar=ENV_HEARTBEAT, show_envvar=True, type=float, default=5.0,
              show_default=True)
@click.option("--poll-seconds", envvar=ENV_POLL, show_envvar=True, type=float, default=1.0, show_default=True,
              help="Metadata poll interval.")
@click.option("--metadata-timeout", type=float, default=2.0, show_default=True)
@click.option("--notice-window", envvar=ENV_NOTICE_WINDOW, show_envvar=True, type=float, default=30.0,
              show_default=True,
              help="Seconds assumed between a notice without a deadline (GCP, a broker's drain) and the hard stop.")
@click.option("--log-seconds", type=float, default=1.0, show_default=True, help="How often output is shipped.")
@click.option("--metrics-seconds", type=float, default=3.0, show_default=True,
              help="The trainer's metrics reports go to the broker at most this often (the rest are folded).")
@click.option("--retry-max-seconds", type=float, default=5.0, show_default=True, help="Broker back-off ceiling.")
@click.option("--final-flush-seconds", type=float, default=None,
              help="At exit, the most seconds to keep delivering to the broker (default: until it has "
                   "every event and log byte, or answers 410 Gone).")
@click.option("--node-rank", envvar="SKYPILOT_NODE_RANK", show_envvar=True, type=click.IntRange(min=0), default=0,
              help="This node's rank in a multi-node job: the agents of nodes above 0 tag their events with "
                   "it and leave the log to node 0's.")
@click.option("--credentials-lead", envvar=ENV_CREDENTIALS_LEAD, show_envvar=True, type=float, default=600.0,
              show_default=True, help="Seconds before the attempt's storage credentials end when fresh ones are "
                                      "asked of the broker.")
@click.option("--max-log-bytes", type=click.IntRange(min=0), default=0, show_default=True,
              help="The most bytes of the trainer's output kept in its log (and shipped); past them a marker. "
                   "0: no bound.")
@click.option("-v", "--verbose", is_flag=True)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(command: tuple[str, ...], broker_url: str | None, token: str | None, token_fd: int | None,
        trainer_env_fd: int | None, job_id: str | None, attempt_id: str | None, cloud: str | None,
        metadata_url: str | None, work_dir: Path | None,
        heartbeat_seconds: float, poll_seconds: float, metadata_timeout: float, notice_window: float,
        log_seconds: float, metrics_seconds: float, retry_max_seconds: float, final_flush_seconds: float | None,
        node_rank: int, credentials_lead: float, max_log_bytes: int, verbose: bool) -> None:
    """Run CMD under the agent: spotbroker agent run -- python train.py ..."""
    from spotbroker.agent.proctree import become_private

    # First: the token is about to be in this process's memory, and the trainer runs as the same user.
    become_private()
    if token_fd is not None:
        try:
            with open(token_fd, "rb", closefd=True) as source:
                token = source.read().decode().strip()
        except OSError as exc:
            raise click.BadParameter(f"cannot read a token from fd {token_fd} ({exc.strerror})",
                                     param_hint="--token-fd") from None
    trainer_env = {} if trainer_env_fd is None else _read_variables(trainer_env_fd)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="spotbroker-agent %(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is too much
    logging.getLogger("httpcore").setLevel(logging.WARNING)

    from spotbroker.agent.config import RunnerConfig
    from spotbroker.agent.runner import run as supervise

    config = RunnerConfig(
        command=list(command), broker_url=broker_url or None, token=token or None, job_id=job_id or None,
        attempt_id=attempt_id or None, cloud=cloud or None, metadata_url=metadata_url or None,
        work_dir=work_dir, heartbeat_interval=heartbeat_seconds, poll_interval=poll_seconds,
        metadata_timeout=metadata_timeout, notice_window=notice_window, log_interval=log_seconds,
        retry_max=retry_max_seconds, final_flush_timeout=final_flush_seconds, node_rank=node_rank,
        credentials_lead=credentials_lead, max_log_bytes=max_log_bytes, trainer_env=trainer_env,
        metrics_interval=metrics_seconds,
    )
    sys.exit(supervise(config))


def _read_variables(fd: int) -> dict[str, str]:
    """The JSON object of variables at `fd` (then closed)."""
    import json

    try:
        with open(fd, "rb", closefd=True) as source:
            variables = json.loads(source.read())
    except (OSError, ValueError) as exc:
        raise click.BadParameter(f"cannot read variables from fd {fd} ({exc})", param_hint="--trainer-env-fd") \
            from None
    if not isinstance(variables, dict) or not all(isinstance(v, str) for v in variables.values()):
        raise click.BadParameter(f"fd {fd} holds no JSON object of strings", param_hint="--trainer-env-fd")
    return variables


@agent.command(context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def simulator(args: tuple[str, ...]) -> None:
    """Serve a simulated cloud metadata service (see --help of the simulator)."""
    from spotbroker.agent.metadata_sim.cli import main

    main(list(args))


if __name__ == "__main__":
    agent(prog_name="spotbroker agent")
