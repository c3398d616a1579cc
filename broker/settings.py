"""Settings from `SPOTBROKER_*` environment variables (and a `.env` file).

The defaults are the embedded set-up: a SQLite file, the local launcher and
a `file://` checkpoint root, all under one data directory.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPOTBROKER_", env_file=".env", extra="ignore")

    data_dir: Path = Field(default_factory=lambda: Path.home() / ".spotbroker")
    database_url: str | None = None            # default: sqlite file in data_dir
    admin_token: SecretStr | None = None        # admin API access (teams, tokens)
    checkpoint_root: str | None = None          # default: file://{data_dir}/checkpoints

    host: str = "127.0.0.1"
    port: int = 8000
    # The local launcher runs any team's commands on the broker's host, so it
    # is on by default only when the server listens on loopback.
    local_launcher: bool | None = None
    local_max_running: int = Field(default_factory=lambda: os.cpu_count() or 1)
    local_kill_grace_seconds: float = 10.0

    reconcile_interval: float = 2.0             # seconds between passes when nothing hints
    lease_seconds: float = 30.0                 # a claimed job is another process's after this
    launch_failover_limit: int = 5              # offers tried per launch round

    # What the CLI talks to.
    url: str = "http://127.0.0.1:8000"
    token: SecretStr | None = None

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url:
            return normalize_database_url(self.database_url)
        return f"sqlite:///{self.data_dir / 'spotbroker.db'}"

    @property
    def checkpoint_uri(self) -> str:
        return self.checkpoint_root or (self.data_dir / "checkpoints").as_uri()

    def local_launcher_enabled(self, host: str | None = None) -> bool:
        if self.local_launcher is not None:
            return self.local_launcher
        return (host or self.host) in LOOPBACK_HOSTS


def normalize_database_url(url: str) -> str:
    """Accept the common `postgresql://` spelling and use the psycopg 3 driver."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


@lru_cache
def get_settings() -> Settings:
    return Settings()
