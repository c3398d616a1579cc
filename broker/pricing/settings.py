"""Price tracking settings, from `SPOTBROKER_PRICES_*` environment variables.

Each source is a setting: `SPOTBROKER_PRICES_SOURCES=catalog,azure` turns
sources on; each has its own interval and endpoint (an endpoint points a
source at a local fake in tests and the demo).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

KNOWN_SOURCES = ("catalog", "aws", "gcp", "azure", "aws-advisor", "aws-public")
# What `serve` reads with no setting: the snapshot, and the live sources
# that need no credentials (Azure's Retail Prices; AWS's Spot Instance
# Advisor feed, the interruption bands of the snapshot's AWS offers; AWS's
# public price-list files, its on-demand list prices and estimated spot).
DEFAULT_SOURCES = ("catalog", "azure", "aws-advisor", "aws-public")
# How a source's offers are shown where its name alone would mislead.
SOURCE_LABELS = {"aws-public": "aws-public (spot estimated from advisor savings)"}


class PricingSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPOTBROKER_PRICES_", env_file=".env", extra="ignore")

    # Which sources the tracker refreshes. The snapshot needs nothing; the
    # live ones use the clouds' standard credential chains (Azure's retail
    # prices and the AWS advisor feed need none). Tests and the demo name
    # theirs (`catalog`, or the local fakes' endpoints): nothing there may
    # reach the network.
    sources: Annotated[list[str], NoDecode] = Field(default_factory=lambda: list(DEFAULT_SOURCES))
    # Seconds between refreshes: spot prices move in minutes, list prices
    # and machine specs in days.
    catalog_interval: float = 86_400.0
    aws_interval: float = 300.0
    aws_list_interval: float = 21_600.0
    gcp_interval: float = 3_600.0
    azure_interval: float = 3_600.0
    aws_advisor_interval: float = 21_600.0     # the feed changes about daily
    # AWS's list prices change a few times a month, and each new version of
    # the price list is gigabytes to download (only the regions it changed).
    aws_public_interval: float = 86_400.0
    # An offer its source has not confirmed for this many of its intervals
    # is stale: still listed, ranked after the fresh ones.
    stale_after_intervals: float = 3.0
    retention_days: float = 90.0
    timeout: float = 10.0                      # seconds, every call to a cloud
    lease_seconds: float = 600.0               # a refresher's hold on its source

    aws_regions: Annotated[list[str], NoDecode] = Field(default_factory=list)   # empty: all the API lists
    # Regions asked side by side: each is a few round trips, so against AWS
    # a refresh takes about the slowest region's time rather than the sum.
    aws_region_workers: int = Field(default=8, ge=1, le=64)
    aws_endpoint_url: str | None = None        # EC2 (moto in tests)
    aws_pricing_endpoint_url: str | None = None
    aws_scores_endpoint_url: str | None = None  # get_spot_placement_scores (a fake in tests: moto lacks it)
    aws_advisor_url: str = "https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json"
    # The Price List Bulk API's region index (public): each region's current
    # offer file is found from it.
    aws_public_url: str = "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/region_index.json"
    aws_public_regions: Annotated[list[str], NoDecode] = Field(default_factory=list)  # empty: all the index lists
    azure_prices_url: str = "https://prices.azure.com/api/retail/prices"
    azure_regions: Annotated[list[str], NoDecode] = Field(default_factory=list)
    azure_management_url: str | None = None
    azure_subscription_id: str | None = None
    gcp_endpoint: str | None = None            # Cloud Billing Catalog API
    gcp_compute_endpoint: str | None = None
    gcp_project: str | None = None

    @field_validator("sources", "aws_regions", "aws_public_regions", "azure_regions", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("sources")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        unknown = [s for s in value if s not in KNOWN_SOURCES]
        if unknown:
            raise ValueError(f"unknown price source(s) {unknown}; known: {', '.join(KNOWN_SOURCES)}")
        return value

    def interval(self, source: str) -> float:
        return float(getattr(self, f"{source.replace('-', '_')}_interval"))

    def stale_after(self, source: str) -> float:
        """Seconds without a confirmation after which an offer of `source` is stale."""
        return self.stale_after_intervals * self.interval(source) if source in KNOWN_SOURCES \
            else self.stale_after_intervals * self.catalog_interval


def source_label(source: str) -> str:
    return SOURCE_LABELS.get(source, source)


@lru_cache
def get_pricing_settings() -> PricingSettings:
    return PricingSettings()
