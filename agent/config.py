"""What the supervisor (:mod:`spotbroker.agent.runner`) is told: the CLI
fills it from its options and the environment; the deliveries read their
intervals and time-outs from it."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class RunnerConfig:
    """Everything the supervisor needs; the CLI fills it from options and the environment."""

    command: list[str]
    broker_url: str | None = None
    token: str | None = field(default=None, repr=False)  # a secret: never logged
    job_id: str | None = None
    attempt_id: str | None = None
    cloud: str | None = None            # aws | gcp | azure | local; None = detect
    metadata_url: str | None = None     # stand-in for the cloud's metadata endpoint
    work_dir: Path | None = None        # outbox, trainer log, control dirs; a fresh temp dir if None
    heartbeat_interval: float = 5.0
    tail_interval: float = 0.1          # events.jsonl is read this often
    log_interval: float = 1.0           # the trainer's output is shipped this often
    poll_interval: float = 1.0          # metadata polls
    metadata_timeout: float = 2.0
    notice_window: float = 30.0         # assumed when a notice carries no deadline (GCP preempted), and a drain
    request_timeout: float = 5.0        # broker requests
    retry_initial: float = 0.2          # broker back-off, jittered
    retry_max: float = 5.0
    # At exit: how long to keep delivering to the broker. None: until it has
    # everything (through any outage) or answers 410 Gone.
    final_flush_timeout: float | None = None
    kill_grace: float = 10.0            # after a cancel: SIGTERM, then SIGKILL this much later
    node_rank: int = 0                  # > 0: events and the shipped log carry it
    credentials_lead: float = 600.0     # storage credentials are renewed this long before they end
    max_log_bytes: int = 0              # of the trainer's output kept in its log (and shipped); 0: no bound
    metrics_interval: float = 3.0       # the trainer's metrics reports go out at most this often (folded)
    trainer_env: dict[str, str] = field(default_factory=dict)  # the trainer's, never in the agent's own environment
