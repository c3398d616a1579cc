"""Azure: spot and pay-as-you-go prices from the Retail Prices API (public,
no credentials), GPU shapes from `azure-mgmt-compute` `resource_skus.list()`
when a subscription is configured, else from the bundled snapshot; the CPU
families' sizes (cpu_families.py) likewise, else from their names.

Retail prices are region-wide (Azure prices no zone apart), Linux only:
Windows products and the retired Low Priority meters are dropped; the spot
meter carries `Spot` in its name.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from spotbroker.broker.pricing import catalog
from spotbroker.broker.pricing.azure_eviction import EvictionRates
from spotbroker.broker.pricing.base import SourceAnswer, SourceUnavailable
from spotbroker.broker.pricing.catalog import OfferRow
from spotbroker.broker.pricing.cpu_families import azure_cpu_shape, azure_cpu_type
from spotbroker.broker.pricing.normalise import QualityReport, accelerator_name
from spotbroker.broker.pricing.settings import PricingSettings

log = logging.getLogger("spotbroker.pricing")
SOURCE = "azure"
API_VERSION = "2023-01-01-preview"
_MAX_PAGES = 10_000  # a loop guard: the full VM meter list is a few hundred pages


@dataclass(frozen=True)
class Shape:
    accelerator: str | None  # None: a CPU machine
    count: float
    vcpus: float | None
    memory_gib: float | None
    regions: frozenset[str] | None = None   # where the subscription may run it (None: not known)


def snapshot_shapes() -> dict[str, Shape]:
    """GPU shapes of the bundled Azure rows (their known errors fixed there),
    and the CPU shapes."""
    with catalog._open("azure_vms_gpu.csv") as f:
        gpu = {r.instance_type: Shape(r.accelerator, r.accelerator_count, r.vcpus, r.memory_gib)
               for r in catalog.azure_rows(f)}
    with catalog._open("azure_vms_cpu.csv") as f:
        cpu = {r.instance_type: Shape(None, 0.0, r.vcpus, r.memory_gib) for r in catalog.cpu_rows("azure", f)}
    return {**cpu, **gpu}


class AzureSource:
    name = SOURCE

    def __init__(self, prices_url: str, *, regions: list[str], timeout: float, skus=None,
                 evictions: EvictionRates | None = None) -> None:
        self.prices_url, self.regions, self.timeout, self.skus = prices_url, regions, timeout, skus
        self.evictions = evictions
        self._evictions_said: str | None = None

    @classmethod
    def from_settings(cls, settings: PricingSettings) -> AzureSource:
        skus = evictions = None
        if settings.azure_subscription_id:  # Azure management credentials are configured
            from azure.identity import DefaultAzureCredential

            credential = DefaultAzureCredential()
            skus = ResourceSkus(credential, settings.azure_subscription_id, settings.azure_management_url,
                                settings.timeout)
            evictions = EvictionRates(credential, settings.azure_management_url, settings.timeout)
        return cls(settings.azure_prices_url, regions=settings.azure_regions, timeout=settings.timeout, skus=skus,
                   evictions=evictions)

    def fetch(self) -> SourceAnswer:
        report = QualityReport()
        shapes = snapshot_shapes()
        if self.skus is not None:
            shapes.update(self.skus.shapes(shapes))
        meters: dict[tuple[str, str], dict[str, float]] = {}
        for item in self._items():
            self._take(item, shapes, meters, report)
        bands = self._bands()
        rows = []
        for (region, sku), price in meters.items():
            shape = shapes[sku]
            if shape.regions is not None and region not in shape.regions:
                report.note("restricted in the region")
                continue
            band = bands.get((region.lower(), sku.lower()))
            rows.append(OfferRow(cloud="azure", region=region, zone=None, zone_id=None, instance_type=sku,
                                 accelerator=shape.accelerator, accelerator_count=shape.count, vcpus=shape.vcpus,
                                 memory_gib=shape.memory_gib, spot_price=price.get("spot"),
                                 ondemand_price=price.get("ondemand"), risk=band,
                                 risk_source="azure-eviction" if band is not None else None))
        scope = {"azure": frozenset(self.regions) if self.regions else None}
        return SourceAnswer(rows, scope, report)

    def _bands(self) -> dict[tuple[str, str], float]:
        """The eviction-rate bands, or none (said once while unavailable)."""
        if self.evictions is None:
            return {}
        try:
            bands = self.evictions.bands()
        except SourceUnavailable as exc:
            if self._evictions_said != str(exc):
                log.warning("prices: azure offers without eviction rates: %s", exc)
                self._evictions_said = str(exc)
            return {}
        self._evictions_said = None
        return bands

    @staticmethod
    def _take(item: dict[str, Any], shapes: dict[str, Shape], meters: dict, report: QualityReport) -> None:
        sku = item.get("armSkuName") or ""
        if sku not in shapes:
            cpu = azure_cpu_shape(sku)
            if cpu is None:
                return  # neither a GPU machine nor one of the CPU families
            shapes[sku] = Shape(None, 0.0, *cpu)
        meter = f"{item.get('meterName', '')} {item.get('skuName', '')}"
        if "Windows" in item.get("productName", "") or "Low Priority" in meter:
            return
        if item.get("type") != "Consumption" or item.get("unitOfMeasure") != "1 Hour":
            return
        if item.get("currencyCode", "USD") != "USD":
            report.note(f"not in USD ({item.get('currencyCode')})")
            return
        price = item.get("retailPrice")
        if not isinstance(price, (int, float)):
            report.note("blank price")
            return
        kind = "spot" if "Spot" in meter else "ondemand"
        meters.setdefault((item["armRegionName"], sku), {})[kind] = float(price)

    def _items(self) -> Iterator[dict[str, Any]]:
        """Every item of every page; a page that fails after the first makes
        the whole refresh fail (never a half-updated set)."""
        flt = "serviceName eq 'Virtual Machines' and priceType eq 'Consumption'"
        if len(self.regions) == 1:
            flt += f" and armRegionName eq '{self.regions[0]}'"
        url: str | None = self.prices_url
        params: dict[str, str] | None = {"api-version": API_VERSION, "$filter": flt}
        with httpx.Client(timeout=self.timeout) as http:
            for page in range(_MAX_PAGES):
                try:
                    r = http.get(url, params=params)
                    r.raise_for_status()
                    body = r.json()
                except (httpx.TransportError, httpx.HTTPStatusError, ValueError) as exc:
                    if page == 0:
                        raise SourceUnavailable(f"Azure retail prices unreachable at {self.prices_url}: "
                                                f"{type(exc).__name__}") from exc
                    raise RuntimeError(f"Azure retail prices: page {page + 1} failed ({exc})") from exc
                for item in body.get("Items") or []:
                    if not self.regions or item.get("armRegionName") in self.regions:
                        yield item
                url, params = body.get("NextPageLink"), None
                if not url:
                    return
        raise RuntimeError(f"Azure retail prices: more than {_MAX_PAGES} pages")


class ResourceSkus:
    """GPU counts, vCPUs, memory and region restrictions of the subscription's
    VM sizes (`resource_skus.list()`): the GPU sizes and the CPU families'."""

    def __init__(self, credential, subscription_id: str, base_url: str | None, timeout: float,
                 *, enforce_https: bool = True) -> None:
        from azure.mgmt.compute import ComputeManagementClient

        kwargs: dict[str, Any] = {"base_url": base_url} if base_url else {}
        self.client = ComputeManagementClient(credential, subscription_id, connection_timeout=timeout,
                                              read_timeout=timeout, retry_total=1, **kwargs)
        self.enforce_https = enforce_https

    def shapes(self, known: dict[str, Shape]) -> dict[str, Shape]:
        from azure.core.exceptions import AzureError, ClientAuthenticationError

        try:
            skus = list(self.client.resource_skus.list(filter=None, enforce_https=self.enforce_https))
        except ClientAuthenticationError as exc:
            raise SourceUnavailable(f"no Azure credentials for resource SKUs ({type(exc).__name__})") from exc
        except AzureError as exc:
            raise SourceUnavailable(f"Azure resource SKUs unreachable ({type(exc).__name__})") from exc
        out: dict[str, Shape] = {}
        regions: dict[str, set[str]] = {}
        for sku in skus:
            if sku.resource_type != "virtualMachines" or not sku.name:
                continue
            caps = {c.name: c.value for c in sku.capabilities or []}
            gpus = float(caps.get("GPUs") or 0)
            name = known[sku.name].accelerator if sku.name in known else accelerator_name(_gpu_token(sku.name))
            if not gpus and azure_cpu_type(sku.name):
                name = None
            elif not gpus or not name:
                continue
            # A size the subscription may not use in a region is no offer there.
            restricted = {loc.lower() for r in sku.restrictions or [] if r.type == "Location"
                          for loc in (r.restriction_info.locations if r.restriction_info else None) or []}
            allowed = {loc.lower() for loc in sku.locations or []} - restricted
            regions.setdefault(sku.name, set()).update(allowed)
            out[sku.name] = Shape(name, gpus, _float(caps.get("vCPUs")), _float(caps.get("MemoryGB")))
        return {n: Shape(s.accelerator, s.count, s.vcpus, s.memory_gib, frozenset(regions.get(n, ())))
                for n, s in out.items()}


def _gpu_token(sku: str) -> str | None:
    """`Standard_NC24ads_A100_v4` -> `A100` (the GPU part of a size's name)."""
    parts = sku.split("_")
    return parts[2] if len(parts) >= 4 else None


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None
