"""Settings from `SPOTBROKER_*` environment variables (and a `.env` file).

The defaults are the embedded set-up: a SQLite file, the local launcher and
a `file://` checkpoint root, all under one data directory.
"""
from __future__ import annotations

import os
import secrets
import time
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


class Settings(BaseSettings):
    # Values stay out of validation errors: several are secrets (keys, tokens, a database password).
    model_config = SettingsConfigDict(env_prefix="SPOTBROKER_", env_file=".env", extra="ignore",
                                      hide_input_in_errors=True)

    data_dir: Path = Field(default_factory=lambda: Path.home() / ".spotbroker")
    database_url: str | None = None            # default: sqlite file in data_dir
    admin_token: SecretStr | None = None        # admin API access (teams, tokens)
    checkpoint_root: str | None = None          # default: file://{data_dir}/checkpoints

    host: str = "127.0.0.1"
    port: int = 8000
    # Proxies whose X-Forwarded-For/-Proto headers are believed (uvicorn's
    # forwarded_allow_ips): comma-separated addresses or networks, "*" for any.
    # Behind a TLS-terminating ingress, name its addresses so that the client's
    # scheme (the dashboard cookie's Secure flag) and address come through; unset,
    # only a proxy on this host (127.0.0.1) is believed, and none where the local
    # launcher runs jobs on this host (trusted_proxies).
    forwarded_allow_ips: str | None = None
    # The longest a connection may take to send a request's line and headers
    # (api/headlimit.py): past it, 408 and closed, so that connections that
    # drip a head byte by byte cannot pile up.
    head_timeout_seconds: float = Field(30.0, gt=0, le=3600)
    # The longest a request's body may take to come whole after its head
    # (api/guard.py; an upload's stream is timed by its own route): past it,
    # 408 and closed, so that stalled bodies cannot hold memory without end.
    body_timeout_seconds: float = Field(60.0, gt=0, le=3600)
    # Bytes of request bodies one server process holds at once (being read, or read and not yet
    # answered; an upload streams to disk): past it, 503 and Retry-After (api/guard.py).
    max_body_bytes_in_flight: int = Field(64 << 20, ge=8 << 20)
    # On SIGTERM, how long requests still in flight may take before they are
    # cut off (uvicorn's timeout_graceful_shutdown): a client trickling an
    # upload must not hold a rolling restart until the orchestrator's SIGKILL.
    # Log streams end at once (api/following.py). Keep it under the pod's
    # terminationGracePeriodSeconds (60 in deploy/kubernetes) less the preStop.
    shutdown_grace_seconds: int = Field(30, ge=1, le=3600)
    # The image's entry (deploy/entrypoint.sh, `spotbroker db ready`): migrate the
    # database before serving (one broker, compose), or, false, wait until a
    # migration job has (several replicas, deploy/kubernetes); and for how long
    # an unreachable database or a schema behind this code is waited for.
    migrate_on_start: bool = True
    db_wait_seconds: float = Field(60.0, ge=0)
    # The local launcher runs any team's commands on the broker's host, so it
    # is on by default only when the server listens on loopback.
    local_launcher: bool | None = None
    local_max_running: int = Field(default_factory=lambda: os.cpu_count() or 1)
    local_kill_grace_seconds: float = 10.0
    # Who local jobs run as (broker/launch/identity.py): unset, as root, each
    # team its own uid and gid, `first + team id` from this range "FIRST-LAST"
    # (no account of the host may hold one); not root, the broker's own user.
    # A user's name runs every team's jobs as that one user; "" as the broker's.
    local_run_as: str | None = None
    local_uid_range: str = "1900000000-1900999999"
    # The jobs' interpreter, first on their PATH (default: the broker's own).
    local_job_python: str | None = None
    # How long an ended local attempt's run directory (its node's home, workdir
    # and raw output) is kept once its node is stopped (broker/launch/local_runs.py).
    local_run_retention_seconds: float = Field(86400.0, ge=60)
    # Jobs that ask for no accelerator and no instance type run on this host
    # (as `infra: local` does) instead of on a cloud CPU machine placed like
    # any other job: for a broker whose host is itself the CPU pool.
    cpu_jobs_on_host: bool = False

    # Which launcher runs jobs placed in a cloud: `local` simulates the place
    # on this host; `skypilot` launches there (broker/launch/skypilot/).
    launcher: Literal["local", "skypilot"] = "local"
    skypilot_cluster_prefix: str = "spotbroker"  # cluster names: {prefix}-{attempt id}
    skypilot_launch_timeout: float = Field(900.0, gt=0)  # a launch waiting longer is cancelled: next place
    skypilot_janitor_interval: float = Field(300.0, gt=0)  # how often clusters no live attempt owns are downed
    # How often SkyPilot's API server is asked whether it answers and `sky check` is run again (the
    # clouds it enables limit placement; a job held because none is enabled is released after one).
    skypilot_check_interval: float = Field(120.0, gt=0)
    # A YAML/JSON file listing the operator's Kubernetes clusters, each a place
    # with a price per GPU-hour (broker/placement/kubernetes.py); unset: none.
    kubernetes_places: Path | None = None
    # Nodes' own storage credentials, scoped to their job (broker/launch/storage_credentials.py):
    # the role STS AssumeRole mints them from for an s3:// root, and how long a session (or an
    # az:// root's SAS tokens) lasts (STS: 900 s to the role's maximum; the agent renews before the end).
    node_role_arn: str | None = None
    node_credentials_seconds: int = Field(3600, ge=900, le=43200)
    # Where a gs:// root's downscoped tokens are exchanged (Google's STS; another for a stand-in).
    node_gcs_sts_url: str = "https://sts.googleapis.com/v1/token"

    reconcile_interval: float = 2.0             # seconds between passes when nothing hints
    lease_seconds: float = 30.0                 # a claimed job is another process's after this
    launch_failover_limit: int = 5              # offers tried per launch round
    # How far a job is recovered before it fails (broker/recovery/attempts.py): a
    # node that failed to start the job's command is launched again this many
    # times, after a wait that starts here and doubles (to 10 min at most);
    # reclaims (preemptions, vanished nodes) are recovered this many times per job.
    launch_retries: int = Field(2, ge=0, le=100)
    launch_retry_seconds: float = Field(10.0, ge=0)
    max_recoveries: int = Field(100, ge=0)
    # Longest wait between two tries of a launch whose launcher's service (SkyPilot's API server) did
    # not answer; the tries stop at the launcher's launch timeout.
    launch_retry_max: float = Field(30.0, gt=0)

    # Signs the per-attempt agent tokens. Brokers sharing a database need the
    # same key; unset, one is made once in data_dir.
    secret_key: SecretStr | None = None
    # Seal what the database keeps secret (jobs' secrets, notification targets):
    # comma-separated keys, the first seals and every one opens; unset, a key
    # derived from the signing key seals (broker/store/sealing.py).
    encryption_keys: SecretStr | None = None
    # Where agents on the nodes reach this broker (default: from host/port).
    advertise_url: str | None = None
    heartbeat_timeout: float = 60.0             # a silent agent's node counts as lost after this
    # Bytes of uploaded workdirs a team may keep in the broker's storage (0: no limit).
    upload_quota_bytes: int = Field(10 * 1024**3, ge=0)
    # Networks (CIDR) that budget notification targets may reach besides public
    # addresses: private, loopback, link-local (metadata) ones are refused unless listed.
    notify_allowed_networks: list[str] = Field(default_factory=list)
    # Bytes of a job's output the broker keeps per attempt (node 0's log, and
    # each node's own): past it, a marker and a `log_truncated` event. 0: no bound.
    max_log_bytes: int = Field(1 << 30, ge=0)
    # Bytes of logs a job's ended attempts keep together: a new attempt removes
    # the oldest ones' logs past it (a `log_removed` event each). 0: no bound.
    max_job_log_bytes: int = Field(4 << 30, ge=0)
    max_followers_per_team: int = Field(64, ge=1)  # log streams (followed or whole) a team holds per process
    # A team's requests a server process works on at once; the rest wait their
    # turn (api/deps.py), so that one team's flood leaves threads and database
    # connections to the others and to the agents.
    max_requests_per_team: int = Field(16, ge=1)
    # Jobs a team may have unfinished (pending, held, running...) at once; a
    # submission past it is refused (429). 3,000 of one team's pending jobs
    # kept the reconciler 80 s behind for every team. 0: no bound.
    max_unfinished_jobs_per_team: int = Field(1000, ge=0)
    # Import SkyPilot (seconds of CPU, ~100 MB) in the background once the
    # server has started, so that the first task file is not kept waiting
    # for it: it made a fresh broker's first `spotbroker submit` take 5-6 s.
    preload_skypilot: bool = True
    # An ended attempt's agent token still works this long (its last events
    # and logs); then the broker answers 410 Gone and the agent stops.
    agent_token_grace: float = Field(default=600.0, ge=0)
    # Simulated notice window of local runs (None: the cloud's own, 120/30/30 s).
    local_notice_window: float | None = None

    # Placement (see broker/placement/placer.py): how often the policy looks again at a
    # job that waits for spot or runs against a deadline; the time a launch
    # loses before training resumes (boot, set-up, loading the checkpoint);
    # how far back each place's spot history reaches, and how fast what was
    # seen before a job started loses weight for it (docs/simulator.md,
    # seventh round); how long a job being moved may take to flush before it
    # is moved anyway.
    placement_interval: float = 60.0
    restart_overhead_seconds: float = 720.0
    placement_history_days: float = 7.0
    placement_memory_half_life_hours: float = Field(24.0, ge=1.0)
    drain_timeout: float = 180.0

    # $/GB to move a checkpoint between regions, for placement: "default",
    # and "REGION_A,REGION_B" pairs (either order). The defaults are the
    # spot-sim protocol's rule (AWS list prices); same region is free.
    egress_usd_per_gb: dict[str, float] = Field(
        default_factory=lambda: {"default": 0.02, "us-east-1,us-east-2": 0.01})

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url:
            return normalize_database_url(self.database_url)
        return f"sqlite:///{self.data_dir / 'spotbroker.db'}"

    @property
    def checkpoint_uri(self) -> str:
        return self.checkpoint_root or (self.data_dir / "checkpoints").as_uri()

    def replica_warnings(self) -> list[str]:
        """What a broker on a database others can share must not keep to
        itself: with these defaults a second replica cannot find the first's
        uploads, and a node reports to the replica that launched it alone
        (both seen lost with the replica: the job's code, its logs, its run)."""
        if self.sqlalchemy_url.startswith("sqlite"):
            return []
        said = []
        if self.checkpoint_root is None:
            said.append(f"SPOTBROKER_CHECKPOINT_ROOT is unset: checkpoints and uploads stay under this broker's "
                        f"data directory ({self.checkpoint_uri}); brokers on one database must share one root "
                        "(an s3://, gs:// or az:// bucket, or one shared file system)")
        if self.advertise_url is None:
            said.append(f"SPOTBROKER_ADVERTISE_URL is unset: nodes report to this broker alone ({self.agent_url}); "
                        "brokers on one database must advertise one address that reaches any of them "
                        "(their load balancer)")
        return said

    @property
    def local_uids(self) -> range:
        first, last = (int(n) for n in self.local_uid_range.split("-"))
        return range(first, last + 1)

    @field_validator("database_url")
    @classmethod
    def _database(cls, value: str | None) -> str | None:
        """PostgreSQL (psycopg 3) or SQLite: another scheme, or no URL at all, would end in a traceback later."""
        if not value:
            return None
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            url = make_url(normalize_database_url(value))
        except ArgumentError:
            raise ValueError("not a database URL: postgresql://USER@HOST/DB or sqlite:////PATH") from None
        if url.drivername not in ("postgresql+psycopg", "sqlite", "sqlite+pysqlite"):
            raise ValueError(f"{url.drivername}: the broker runs on PostgreSQL (postgresql://USER@HOST/DB) "
                             "or SQLite (sqlite:////PATH)")
        return value

    @field_validator("local_uid_range")
    @classmethod
    def _uid_range(cls, value: str) -> str:
        first, sep, last = value.strip().partition("-")
        if not (sep and first.isdigit() and last.isdigit()):
            raise ValueError("FIRST-LAST, e.g. 1900000000-1900999999")
        if not 1000 <= int(first) < int(last) <= 2**32 - 2:
            raise ValueError("1000 <= FIRST < LAST <= 4294967294 (no system account's, nor root's)")
        return f"{int(first)}-{int(last)}"

    @field_validator("notify_allowed_networks")
    @classmethod
    def _networks(cls, networks: list[str]) -> list[str]:
        import ipaddress

        for n in networks:
            try:
                ipaddress.ip_network(n, strict=False)
            except ValueError:
                raise ValueError(f"{n!r}: a network such as 10.0.0.0/8 or fd00::/8") from None
        return networks

    @field_validator("encryption_keys")
    @classmethod
    def _encryption_keys(cls, keys: SecretStr | None) -> SecretStr | None:
        if keys is not None and any(len(k.strip()) < 32 for k in keys.get_secret_value().split(",")):
            # never the keys themselves in the message
            raise ValueError("each key is at least 32 random characters, e.g. from "
                             "python -c 'import secrets; print(secrets.token_urlsafe(32))'")
        return keys

    def encryption_key_list(self) -> list[str]:
        return [k.strip() for k in self.encryption_keys.get_secret_value().split(",")] if self.encryption_keys else []

    @field_validator("egress_usd_per_gb")
    @classmethod
    def _egress(cls, table: dict[str, float]) -> dict[str, float]:
        for key, price in table.items():
            if key != "default" and len([r for r in key.split(",") if r.strip()]) != 2:
                raise ValueError(f"{key!r}: use 'default' or 'REGION_A,REGION_B'")
            if price < 0:
                raise ValueError(f"{key!r}: a price cannot be negative")
        return table

    @property
    def deadline_margin_seconds(self) -> float:
        """Kept free before every deadline: a move may take a drain and a pass
        or so to start its next attempt, beyond the policy's own one step."""
        return self.drain_timeout + self.placement_interval

    @property
    def agent_url(self) -> str:
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    def signing_key(self) -> bytes:
        if self.secret_key is not None:
            return self.secret_key.get_secret_value().encode()
        path = self.data_dir / "secret_key"
        path.parent.mkdir(parents=True, exist_ok=True)
        try:  # O_EXCL: brokers starting together on one data dir agree on one key
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            for _ in range(50):
                key = path.read_bytes().strip()
                if key:
                    return key
                time.sleep(0.01)
            raise RuntimeError(f"{path} is empty: delete it or set SPOTBROKER_SECRET_KEY") from None
        key = secrets.token_urlsafe(48).encode()
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        return key

    def local_launcher_enabled(self, host: str | None = None) -> bool:
        if self.local_launcher is not None:
            return self.local_launcher
        return (host or self.host) in LOOPBACK_HOSTS

    def trusted_proxies(self, host: str | None = None) -> str | list[str]:
        """Whose X-Forwarded-For/-Proto uvicorn believes: as set; unset, a proxy
        on this host (127.0.0.1), but no one where the local launcher runs
        jobs here (every team's job connects from 127.0.0.1 too, and would
        name the client's address and scheme: the cookie's Secure flag)."""
        if self.forwarded_allow_ips is not None:
            return self.forwarded_allow_ips
        return [] if self.local_launcher_enabled(host) else "127.0.0.1"


def normalize_database_url(url: str) -> str:
    """Accept the common `postgresql://` spelling and use the psycopg 3 driver."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


@lru_cache
def get_settings() -> Settings:
    return Settings()

