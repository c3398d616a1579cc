"""Money settings, from `SPOTBROKER_MONEY_*` environment variables."""
from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from spotbroker.broker.checkpoints.settings import CheckpointSettings


class MoneySettings(CheckpointSettings):
    """Extends the checkpoint settings (retention, the cold tier, storage
    prices), which share the `SPOTBROKER_MONEY_` prefix and are read
    below the money room (broker/checkpoints/coldtier.py)."""

    model_config = SettingsConfigDict(env_prefix="SPOTBROKER_MONEY_", env_file=".env", extra="ignore")

    # Seconds between accrual passes, and the grid entries are cut on: a
    # running attempt is written to the last whole interval (at most two
    # behind, one row each); readers add the unwritten tail.
    accrual_interval: float = Field(60.0, gt=0, le=60)
    # Seconds between alert evaluations (and outbox deliveries).
    alert_interval: float = Field(60.0, gt=0)
    # A rate's alert (burn, forecast, committed) resolves once its condition
    # has been clear this many seconds, so the minutes between a preempted
    # attempt and its recovery do not resolve it and fire it again.
    alert_resolve_seconds: float = Field(900.0, ge=0)
    # A background duty's hold, so that one broker of several does it at a time.
    lease_seconds: float = Field(120.0, gt=0)
    # Outbox: tries before a notification is given up (it stays listed), and
    # the first retry's delay (doubling up to an hour).
    notify_max_tries: int = Field(20, ge=1)
    notify_retry_seconds: float = Field(5.0, gt=0)
    notify_timeout: float = Field(10.0, gt=0)
    # Dashboard logins (stored server-side, broker/auth/sessions.py): a
    # session ends this many seconds after its login, or after this many
    # seconds unused, whichever comes first.
    dashboard_lifetime_seconds: float = Field(8 * 3600.0, gt=0)
    dashboard_idle_seconds: float = Field(3600.0, gt=0)
    # Bearer token that may scrape /metrics (the admin token may too):
    # SPOTBROKER_METRICS_TOKEN, named as operators expect it.
    metrics_token: SecretStr | None = Field(None, validation_alias="SPOTBROKER_METRICS_TOKEN")


def get_money_settings() -> MoneySettings:
    return MoneySettings()
