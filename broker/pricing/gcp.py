"""GCP: on-demand and Spot prices from the Cloud Billing Catalog API
(`google-cloud-billing`, Compute Engine service `6F81-5844-456A`).

GCP bills a machine as the sum of its parts: its vCPUs at the series'
core SKU, its memory at the series' RAM SKU, and its GPUs (if any) at the GPU
SKU, each per region, on-demand (`OnDemand`) or Spot (`Preemptible`). The
machine types (GPU machines, and the CPU families of cpu_families.py) and the
zones that offer them come from Compute Engine when a project is known
(`gcp_zones.py`), else from the bundled snapshot.
"""
from __future__ import annotations

import logging
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from spotbroker.broker.pricing import catalog, gcp_n1
from spotbroker.broker.pricing.base import SourceAnswer, SourceUnavailable
from spotbroker.broker.pricing.catalog import OfferRow
from spotbroker.broker.pricing.cpu_families import GCP_SERIES, GCP_SKU_SERIES, gcp_family
from spotbroker.broker.pricing.gcp_zones import ComputeZones
from spotbroker.broker.pricing.normalise import QualityReport, accelerator_name
from spotbroker.broker.pricing.settings import PricingSettings

log = logging.getLogger("spotbroker.pricing")
SOURCE = "gcp"
SERVICE = "services/6F81-5844-456A"  # Compute Engine
_DESCRIPTION = re.compile(r"^(?:Spot Preemptible )?(?P<what>.+?) running in ")
_SERIES = {f"{name} Instance {part}": (series, part.lower())
           for series, name in {**GCP_SERIES, **GCP_SKU_SERIES}.items() for part in ("Core", "Ram")}


@dataclass(frozen=True)
class Machine:
    instance_type: str
    series: str
    region: str
    zone: str
    vcpus: float
    memory_gib: float
    accelerator: str | None  # None: a CPU machine (cores and RAM only)
    count: int


def snapshot_machines() -> list[Machine]:
    """GPU machine types per zone, from the bundled snapshot's host rows
    (the N1 sizes with the GPUs they carry where the zone has them), and its
    CPU machine types."""
    import csv

    machines = [Machine(r.instance_type, gcp_family(r.instance_type), r.region, r.zone or "", r.vcpus or 0.0,
                        r.memory_gib or 0.0, r.accelerator, int(r.accelerator_count)) for r in catalog.snapshot_rows()
                if r.cloud == "gcp" and (r.accelerator is None or gcp_n1.is_host(r.instance_type))]
    with catalog._open("gcp_vms_gpu.csv") as f:
        for r in csv.DictReader(f):
            shape = catalog.gcp_host_gpu(r["InstanceType"]) if r["InstanceType"] else None
            series = next((s for s in GCP_SERIES if r["InstanceType"].startswith(s)), None)
            if shape and series:
                machines.append(Machine(r["InstanceType"], series, r["Region"], r["AvailabilityZone"],
                                        float(r["vCPUs"]), float(r["MemoryGiB"]), shape[0], shape[1]))
    return machines


def _unit_price(sku: Any) -> tuple[float, str] | None:
    """The first tier's price per unit, with its currency (None when the SKU
    has no price)."""
    if not sku.pricing_info:
        return None
    expr = sku.pricing_info[0].pricing_expression
    if not expr.tiered_rates:
        return None
    money = expr.tiered_rates[-1].unit_price
    return money.units + money.nanos / 1e9, money.currency_code or "USD"


class GcpSource:
    name = SOURCE

    def __init__(self, client, *, timeout: float, machines: list[Machine] | None = None,
                 zones: ComputeZones | None = None) -> None:
        self.client, self.timeout, self.zones = client, timeout, zones
        self.machines = machines if machines is not None else snapshot_machines()
        self._zones_said: str | None = None

    @classmethod
    def from_settings(cls, settings: PricingSettings) -> GcpSource:
        from google.api_core.client_options import ClientOptions
        from google.cloud import billing_v1

        project = settings.gcp_project
        if settings.gcp_endpoint:  # a local fake (tests, the demo): no credentials, plain REST
            from google.auth.credentials import AnonymousCredentials

            credentials = AnonymousCredentials()
            client = billing_v1.CloudCatalogClient(credentials=credentials, transport="rest",
                                                   client_options=ClientOptions(api_endpoint=settings.gcp_endpoint))
        else:
            import google.auth
            from google.auth.exceptions import DefaultCredentialsError

            try:
                credentials, default_project = google.auth.default()
            except DefaultCredentialsError as exc:
                raise SourceUnavailable("no GCP credentials (application default credentials)") from exc
            project = project or default_project
            client = billing_v1.CloudCatalogClient(credentials=credentials, transport="rest")
        zones = None
        if project:  # the Compute API lists a project's zones; without one, the snapshot's
            zones = ComputeZones.build(credentials, project, settings.gcp_compute_endpoint or settings.gcp_endpoint,
                                       settings.timeout)
        return cls(client, timeout=settings.timeout, zones=zones)

    def fetch(self) -> SourceAnswer:
        report = QualityReport()
        prices = self._prices(report)
        machines = self._machines(report)
        rows = []
        for m in machines:
            parts = prices.get(m.region, {})
            rows.append(OfferRow(
                cloud="gcp", region=m.region, zone=m.zone, zone_id=None, instance_type=m.instance_type,
                accelerator=m.accelerator, accelerator_count=float(m.count), vcpus=m.vcpus, memory_gib=m.memory_gib,
                spot_price=self._machine_price(m, parts, "Preemptible"),
                ondemand_price=self._machine_price(m, parts, "OnDemand")))
        for region in sorted({m.region for m in machines} - set(prices)):
            report.note("region not served by the API")
            log.info("prices: gcp no longer prices %s; its offers are unlisted", region)
        # Machines in regions the API no longer prices come out without prices
        # and are dropped: the source is the authority for all of GCP.
        return SourceAnswer(rows, {"gcp": None}, report)

    def _machines(self, report: QualityReport) -> list[Machine]:
        """Compute Engine's GPU machine types per zone, else the snapshot's
        (said once while the Compute API stays unavailable)."""
        if self.zones is None:
            return self.machines
        try:
            machines = self.zones.machines(report)
        except SourceUnavailable as exc:
            if self._zones_said != str(exc):
                log.warning("prices: gcp zones from the snapshot: %s", exc)
                self._zones_said = str(exc)
            return self.machines
        self._zones_said = None
        return machines

    @staticmethod
    def _machine_price(m: Machine, parts: dict[tuple[str, str], float], usage: str) -> float | None:
        core, ram = parts.get((f"{m.series}:core", usage)), parts.get((f"{m.series}:ram", usage))
        gpu = parts.get((f"gpu:{m.accelerator}", usage)) if m.accelerator else 0.0
        if core is None or ram is None or gpu is None:
            return None
        return round(core * m.vcpus + ram * m.memory_gib + gpu * m.count, 6)

    def _prices(self, report: QualityReport) -> dict[str, dict[tuple[str, str], float]]:
        """region -> {(part, usage type): $ per unit}, from every SKU page."""
        import requests
        from google.api_core import exceptions as gexc
        from google.auth import exceptions as aexc

        out: dict[str, dict[tuple[str, str], float]] = defaultdict(dict)
        try:
            pager = self.client.list_skus(parent=SERVICE, retry=None, timeout=self.timeout)
            for sku in pager:  # each page is fetched as the iteration reaches it
                # the raw protobuf message: proto-plus's attribute access is the slow part
                self._take(type(sku).pb(sku), out, report)
        except (aexc.DefaultCredentialsError, aexc.TransportError, gexc.ServiceUnavailable,
                requests.ConnectionError, requests.Timeout) as exc:
            if not out:  # the first page: the API is not here; later: a failed refresh
                raise SourceUnavailable(f"GCP billing catalog unreachable ({type(exc).__name__})") from exc
            raise
        return out

    @staticmethod
    def _take(sku: Any, out: dict, report: QualityReport) -> None:
        match = _DESCRIPTION.match(sku.description)
        usage = sku.category.usage_type
        if match is None or usage not in ("OnDemand", "Preemptible"):
            return
        what = match["what"]
        if what in _SERIES:
            series, part = _SERIES[what]
            key = f"{series}:{part}"
        elif sku.category.resource_group == "GPU" and what.endswith(" GPU"):
            name = accelerator_name(what.removesuffix(" GPU"))
            if name is None:
                return
            key = f"gpu:{name}"
        else:
            return
        price = _unit_price(sku)
        if price is None:
            report.note("blank price")
            return
        if price[1] != "USD":
            report.note(f"not in USD ({price[1]})")
            return
        if price[0] <= 0:
            report.note("placeholder zero price")
            return
        for region in sku.service_regions:
            out[region][(key, usage)] = price[0]
