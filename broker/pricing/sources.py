"""The price sources by name, built from the settings. Cloud SDKs are
imported only when their source is turned on."""
from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.pricing import catalog
from spotbroker.broker.pricing.base import Source, SourceAnswer, SourceUnavailable
from spotbroker.broker.pricing.settings import PricingSettings


class CatalogSource:
    """The bundled snapshot: the fallback that never goes away."""

    name = catalog.SOURCE

    def fetch(self) -> SourceAnswer:
        return SourceAnswer(catalog.snapshot_rows(), {"aws": None, "gcp": None, "azure": None})


class AdvisorSource:
    """AWS's Spot Instance Advisor feed (public): the interruption band of
    each region's instance types, as the risk of the AWS offers another
    source prices (the snapshot's, with no credentials)."""

    name = "aws-advisor"

    def __init__(self, url: str, timeout: float, read) -> None:
        self.url, self.timeout, self.read = url, timeout, read

    def fetch(self) -> SourceAnswer:
        import httpx

        try:
            bands = self.read(self.url, self.timeout)
        except httpx.TransportError as exc:
            raise SourceUnavailable(f"AWS Spot Instance Advisor feed unreachable at {self.url} "
                                    f"({type(exc).__name__})") from exc
        return SourceAnswer([], {}, risks={("aws", region, itype): (value, self.name)
                                           for (region, itype), value in bands.items()})


def build_source(name: str, settings: PricingSettings, factory: sessionmaker[Session] | None = None) -> Source:
    """The source `name`; `factory` is the broker's database, where a source
    that reads large files remembers which versions it has read."""
    if name == "catalog":
        return CatalogSource()
    if name == "azure":
        from spotbroker.broker.pricing.azure import AzureSource

        return AzureSource.from_settings(settings)
    if name == "gcp":
        from spotbroker.broker.pricing.gcp import GcpSource

        return GcpSource.from_settings(settings)
    if name == "aws-advisor":
        from spotbroker.broker.pricing.aws import advisor_risks

        return AdvisorSource(settings.aws_advisor_url, settings.timeout, advisor_risks)
    if name == "aws":
        from spotbroker.broker.pricing.aws import AwsSource

        return AwsSource.from_settings(settings)
    if name == "aws-public":
        from spotbroker.broker.pricing.aws_public import AwsPublicSource

        if factory is None:
            raise ValueError("aws-public keeps the versions of the files it read in the database: "
                             "build it with the broker's session factory")
        return AwsPublicSource.from_settings(settings, factory)
    raise ValueError(f"unknown price source {name!r}")


def build_sources(settings: PricingSettings, names: list[str] | None = None,
                  factory: sessionmaker[Session] | None = None) -> dict[str, Source]:
    return {name: build_source(name, settings, factory) for name in (names or settings.sources)}
