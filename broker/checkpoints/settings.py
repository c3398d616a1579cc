"""Checkpoint storage settings: retention, the cold tier, storage prices,
from `SPOTBROKER_MONEY_*` environment variables (the money settings,
broker/money/settings.py, extend these under the same prefix)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class CheckpointSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPOTBROKER_MONEY_", env_file=".env", extra="ignore")

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


def get_checkpoint_settings() -> CheckpointSettings:
    return CheckpointSettings()
