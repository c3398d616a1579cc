"""Money settings, from `SPOTBROKER_MONEY_*` environment variables."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class MoneySettings(BaseSettings):
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
    # Checkpoint storage: committed checkpoints older than this many days
    # move to the cold tier (but `keep` ones, and local-disk ones), checked
    # every `archive_interval` seconds; `cold_storage_class` is the S3 class
    # (GCS's is ARCHIVE, Azure's the Archive tier).
    checkpoint_retention_days: float = Field(90.0, gt=0)
    archive_interval: float = Field(3600.0, gt=0)
    cold_storage_class: Literal["GLACIER", "DEEP_ARCHIVE"] = "GLACIER"
    # A restored cold checkpoint stays readable this long (S3's restore Days),
    # and the restore's speed (S3 Glacier: Expedited, Standard, Bulk; Azure:
    # Expedited is the High rehydrate priority, the others Standard).
    restore_days: int = Field(7, ge=1, le=365)
    restore_tier: Literal["Expedited", "Standard", "Bulk"] = "Standard"
    # $ per GB-month, for the dashboard's storage cost (S3 us-east-1 list
    # prices: STANDARD 0.023, GLACIER Flexible Retrieval 0.0036, DEEP_ARCHIVE 0.00099).
    storage_price_standard: float = Field(0.023, ge=0)
    storage_price_glacier: float = Field(0.0036, ge=0)
    storage_price_deep_archive: float = Field(0.00099, ge=0)
    # GCS Archive (us-central1) and Azure's Archive tier (LRS, East US) list prices.
    storage_price_gcs_archive: float = Field(0.0012, ge=0)
    storage_price_azure_archive: float = Field(0.00099, ge=0)
    # Dashboard logins (stored server-side, broker/money/sessions.py): a
    # session ends this many seconds after its login, or after this many
    # seconds unused, whichever comes first.
    dashboard_lifetime_seconds: float = Field(8 * 3600.0, gt=0)
    dashboard_idle_seconds: float = Field(3600.0, gt=0)
    # Bearer token that may scrape /metrics (the admin token may too):
    # SPOTBROKER_METRICS_TOKEN, named as operators expect it.
    metrics_token: SecretStr | None = Field(None, validation_alias="SPOTBROKER_METRICS_TOKEN")


def get_money_settings() -> MoneySettings:
    return MoneySettings()
