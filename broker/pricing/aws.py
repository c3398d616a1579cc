"""AWS through boto3 and the standard credential chain: spot prices per
region (`describe_spot_price_history`, newest per AZ and type), the specs
of GPU types and of the CPU families (`describe_instance_types`) and on-demand prices (the Pricing API's
`get_products`) on the slower list interval, and the risk signals: spot
placement scores per AZ and the Spot Instance Advisor's interruption band.
"""
from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from spotbroker.broker.pricing import risk
from spotbroker.broker.pricing.base import SourceAnswer, SourceUnavailable
from spotbroker.broker.pricing.catalog import OfferRow
from spotbroker.broker.pricing.cpu_families import AWS_FAMILIES, aws_cpu_type
from spotbroker.broker.pricing.normalise import QualityReport, accelerator_name
from spotbroker.broker.pricing.settings import PricingSettings

log = logging.getLogger("spotbroker.pricing")
SOURCE = "aws"
_LINUX = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")


# The types whose specs are read: every NVIDIA GPU family is named p* (p3, p4d,
# p5, p6-b200...) or g* (g4dn, g5, g5g, g6e, gr6...), and the CPU families are
# cpu_families.AWS_FAMILIES. Asked of the API as a filter: about a tenth of the
# ~1,000 types, so a tenth of the pages to fetch and parse.
LISTED_TYPES = {"Name": "instance-type", "Values": ["p*", "g*", *(f"{family}.*" for family in AWS_FAMILIES)]}


@dataclass(frozen=True)
class Spec:
    accelerator: str | None  # None: a CPU machine
    count: float
    vcpus: float
    memory_gib: float


class AwsSource:
    name = SOURCE

    def __init__(self, settings: PricingSettings, session=None) -> None:
        import boto3
        from botocore.config import Config

        self.settings = settings
        self.session = session or boto3.session.Session()
        self.config = Config(connect_timeout=settings.timeout, read_timeout=settings.timeout,
                             retries={"max_attempts": 2, "mode": "standard"})
        self._lists: tuple[float, dict[str, Spec], dict[tuple[str, str], float]] | None = None
        # A client costs tens of ms of CPU to build (service models): one per
        # (service, region, endpoint) for the source's life, not per refresh.
        self._clients: dict[tuple[str, str, str | None], Any] = {}

    @classmethod
    def from_settings(cls, settings: PricingSettings) -> AwsSource:
        return cls(settings)

    def _client(self, service: str, region: str, endpoint: str | None):
        key = (service, region, endpoint)
        if key not in self._clients:  # built in the refreshing thread only (a session is not thread-safe)
            self._clients[key] = self.session.client(service, region_name=region, endpoint_url=endpoint,
                                                     config=self.config)
        return self._clients[key]

    def fetch(self) -> SourceAnswer:
        from botocore.exceptions import EndpointConnectionError, NoCredentialsError, NoRegionError

        report = QualityReport()
        try:
            ec2 = self._client("ec2", "us-east-1", self.settings.aws_endpoint_url)
            regions = self.settings.aws_regions or sorted(
                r["RegionName"] for r in ec2.describe_regions()["Regions"])
        except (NoCredentialsError, NoRegionError) as exc:
            raise SourceUnavailable(f"no AWS credentials ({type(exc).__name__})") from exc
        except EndpointConnectionError as exc:
            raise SourceUnavailable(f"AWS unreachable ({exc})") from exc
        specs, ondemand = self._list_prices(ec2, regions, report)
        advisor = self._advisor(report)
        # Placement scores name their regions in the request: one client (a
        # client is thread-safe) asks for every region, where a client per
        # region would cost ~1 MB and ~50 ms of CPU each to build.
        scores_client = self._client("ec2", "us-east-1",
                                     self.settings.aws_scores_endpoint_url or self.settings.aws_endpoint_url)
        clients = {r: self._client("ec2", r, self.settings.aws_endpoint_url) for r in regions}
        # Regions are independent and each is a few round trips: asked side by
        # side, a refresh takes about the slowest region's time, not the sum.
        with ThreadPoolExecutor(max_workers=max(1, self.settings.aws_region_workers),
                                thread_name_prefix="prices-aws") as pool:
            per_region = pool.map(lambda r: self._region_rows(r, clients[r], scores_client, specs, ondemand, advisor,
                                                                report),
                                  regions)
            rows = [row for region_rows in per_region for row in region_rows]
        scope = {"aws": frozenset(regions) if self.settings.aws_regions else None}
        return SourceAnswer(rows, scope, report)

    def _region_rows(self, region: str, ec2r, scores_client, specs: dict[str, Spec],
                     ondemand: dict[tuple[str, str], float], advisor: dict[tuple[str, str], float],
                     report: QualityReport) -> list[OfferRow]:
        zone_ids = {z["ZoneName"]: z["ZoneId"] for z in ec2r.describe_availability_zones()["AvailabilityZones"]}
        # a placement score is asked for GPU types, and says nothing of a CPU type's market
        scores = self._scores(scores_client, region, [t for t, s in specs.items() if s.accelerator], report)
        rows = []
        for (zone, itype), price in self._spot_prices(ec2r, list(specs)).items():
            spec, zone_id = specs[itype], zone_ids.get(zone)
            band = advisor.get((region, itype))
            zone_id_scores = scores if spec.accelerator else {}
            rows.append(OfferRow(
                cloud="aws", region=region, zone=zone, zone_id=zone_id, instance_type=itype,
                accelerator=spec.accelerator, accelerator_count=spec.count, vcpus=spec.vcpus,
                memory_gib=spec.memory_gib, spot_price=price, ondemand_price=ondemand.get((region, itype)),
                risk=risk.combine(band, zone_id_scores.get(zone_id)),
                risk_source="aws-advisor+score" if band is not None and zone_id in zone_id_scores
                else "aws-advisor" if band is not None else "aws-score" if zone_id in zone_id_scores else None))
        return rows

    # --- specs and on-demand prices: on the list interval -------------------------------

    def _list_prices(self, ec2, regions: list[str], report: QualityReport):
        if self._lists is not None and time.monotonic() - self._lists[0] < self.settings.aws_list_interval:
            return self._lists[1], self._lists[2]
        specs: dict[str, Spec] = {}
        for page in ec2.get_paginator("describe_instance_types").paginate(Filters=[LISTED_TYPES]):
            for t in page["InstanceTypes"]:
                gpus = (t.get("GpuInfo") or {}).get("Gpus") or []
                vcpus, memory = float(t["VCpuInfo"]["DefaultVCpus"]), t["MemoryInfo"]["SizeInMiB"] / 1024
                if gpus and gpus[0].get("Manufacturer") == "NVIDIA":
                    specs[t["InstanceType"]] = Spec(_aws_gpu_name(gpus[0]), float(sum(g["Count"] for g in gpus)),
                                                    vcpus, memory)
                elif not gpus and aws_cpu_type(t["InstanceType"]):
                    specs[t["InstanceType"]] = Spec(None, 0.0, vcpus, memory)
        ondemand = self._ondemand(sorted(specs), set(regions), report)
        self._lists = (time.monotonic(), specs, ondemand)
        return specs, ondemand

    def _ondemand(self, types: list[str], regions: set[str], report: QualityReport) -> dict[tuple[str, str], float]:
        pricing = self._client("pricing", "us-east-1", self.settings.aws_pricing_endpoint_url)
        out: dict[tuple[str, str], float] = {}
        base = [("operatingSystem", "Linux"), ("tenancy", "Shared"), ("preInstalledSw", "NA"),
                ("capacitystatus", "Used")]
        for itype in types:
            filters = [{"Type": "TERM_MATCH", "Field": f, "Value": v} for f, v in [*base, ("instanceType", itype)]]
            for page in pricing.get_paginator("get_products").paginate(ServiceCode="AmazonEC2", Filters=filters):
                for raw in page["PriceList"]:
                    product = json.loads(raw) if isinstance(raw, str) else raw
                    region = product["product"]["attributes"].get("regionCode")
                    if region in regions:
                        price = _hourly_usd(product, report)
                        if price is not None:
                            out[(region, itype)] = price
        return out

    # --- per region: spot prices and placement scores ----------------------------------

    @staticmethod
    def _spot_prices(ec2r, types: list[str]) -> dict[tuple[str, str], float]:
        """The newest Linux spot price per (zone, type) of the last day."""
        newest: dict[tuple[str, str], tuple[datetime, float]] = {}
        since = datetime.now(UTC) - timedelta(days=1)
        pages = ec2r.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=types, ProductDescriptions=["Linux/UNIX"], StartTime=since)
        for page in pages:
            for p in page["SpotPriceHistory"]:
                if p["ProductDescription"] not in _LINUX:
                    continue
                key, at = (p["AvailabilityZone"], p["InstanceType"]), p["Timestamp"]
                if key not in newest or at > newest[key][0]:
                    newest[key] = (at, float(p["SpotPrice"]))
        return {k: price for k, (_, price) in newest.items()}

    @staticmethod
    def _scores(client, region: str, types: list[str], report: QualityReport) -> dict[str, float]:
        """zone id -> risk from the spot placement score of one GPU VM there."""
        from botocore.exceptions import BotoCoreError, ClientError

        out: dict[str, float] = {}
        try:
            answer = client.get_spot_placement_scores(InstanceTypes=types[:10] or ["p4d.24xlarge"],
                                                      TargetCapacity=1, SingleAvailabilityZone=True,
                                                      RegionNames=[region])
        except (BotoCoreError, ClientError) as exc:
            report.note(f"no placement scores ({type(exc).__name__})")
            return out
        for s in answer.get("SpotPlacementScores", []):
            value = risk.from_placement_score(int(s["Score"]))
            if s.get("AvailabilityZoneId") and value is not None:
                out[s["AvailabilityZoneId"]] = value
        return out

    def _advisor(self, report: QualityReport) -> dict[tuple[str, str], float]:
        """(region, type) -> risk from the Spot Instance Advisor's band."""
        try:
            return advisor_risks(self.settings.aws_advisor_url, self.settings.timeout)
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            report.note(f"no spot advisor feed ({type(exc).__name__})")
            return {}


def advisor_risks(url: str, timeout: float) -> dict[tuple[str, str], float]:
    """(region, type) -> risk from the Spot Instance Advisor feed (public,
    no credentials); raises httpx.HTTPError, ValueError or KeyError."""
    r = httpx.get(url, timeout=timeout)
    r.raise_for_status()
    feed = r.json()["spot_advisor"]
    out = {}
    for region, by_os in feed.items():
        for itype, entry in (by_os.get("Linux") or {}).items():
            value = risk.from_advisor_band(int(entry.get("r", -1)))
            if value is not None:
                out[(region, itype)] = value
    return out


def _aws_gpu_name(gpu: dict[str, Any]) -> str:
    """`A100` with 80 GiB is the A100-80GB; `V100` with 32 GiB the V100-32GB."""
    name, mib = gpu.get("Name", ""), (gpu.get("MemoryInfo") or {}).get("SizeInMiB", 0)
    if name in ("A100", "V100") and mib >= (81920 if name == "A100" else 32768):
        name = f"{name}-{mib // 1024}GB"
    return accelerator_name(name) or name


def _hourly_usd(product: dict[str, Any], report: QualityReport) -> float | None:
    for term in (product.get("terms", {}).get("OnDemand") or {}).values():
        for dim in term.get("priceDimensions", {}).values():
            if dim.get("unit") != "Hrs":
                continue
            usd = dim.get("pricePerUnit", {}).get("USD")
            if usd is None:
                report.note("not in USD")
                return None
            if float(usd) <= 0:
                report.note("placeholder zero price")
                return None
            return float(usd)
    return None
