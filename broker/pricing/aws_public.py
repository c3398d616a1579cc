"""AWS prices with no credentials: on-demand list prices and specs from the
Price List Bulk API's public files, spot prices estimated from the Spot
Instance Advisor feed; for the GPU types and the CPU families (cpu_families.py).

- The region index (`…/AmazonEC2/current/region_index.json`) names each
  region's current offer file by a versioned URL. A region's file is
  downloaded (streamed and filtered, aws_price_list.py) only when that URL
  changed since the last refresh of any broker on this database: the
  versions and the rows kept of each file live in `price_list_files`. The
  index itself is asked with `If-None-Match`, so a refresh with nothing
  published since costs one 304.
- Spot: AWS publishes no current spot price without credentials. The
  advisor feed gives, per region and instance type, the saving of spot over
  on-demand averaged over the last 30 days and across the region's zones
  (`s`, a whole percent), republished irregularly; spot is estimated as
  on-demand x (1 - s/100), the same price in every zone of the region. The
  offers say so (`source` is shown as `aws-public (spot estimated from
  advisor savings)`), the live `aws` source replaces them wherever it runs
  (store.py ranks it above), and the feed's band is their risk.
- Zones: the estimate is spread over the zones the bundled snapshot lists
  for that region and type (zone ids, as the snapshot's and the live
  source's offers carry them), so placement can cool one zone down and
  try the next; a type the snapshot does not know is offered region-wide.

A region whose file fails (time-out, cut off mid-way, not a CSV) is left
out of the refresh's scope: its offers keep their previous prices and turn
stale in time; never a half-read file's prices.

What is kept of a file depends on what this reader wants of it: a file kept
by a reader that wanted less (before the CPU families, GPU types only) is
read again, as if a new version had been published (`_READS`).
"""
from __future__ import annotations

import json
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urljoin

import httpx
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.pricing import catalog, risk
from spotbroker.broker.pricing.aws_price_list import FAMILY_GPU, BadOfferFile, ListPrice, read_offer_file
from spotbroker.broker.pricing.base import SourceAnswer, SourceUnavailable
from spotbroker.broker.pricing.catalog import OfferRow
from spotbroker.broker.pricing.cpu_families import aws_cpu_type
from spotbroker.broker.pricing.normalise import QualityReport
from spotbroker.broker.pricing.settings import PricingSettings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import PriceListFile

log = logging.getLogger("spotbroker.pricing")
SOURCE = "aws-public"
INDEX, ADVISOR = "region_index", "advisor"   # the other files remembered beside the regions'
# A commercial region (`eu-west-1`); not a Local or Wavelength Zone
# (`us-east-1-bos-1`), GovCloud or a sovereign partition, which an account
# of the commercial partition cannot run in.
_REGION = re.compile(r"[a-z]{2}-[a-z]+-\d+")
# What a kept file's version is stamped with: what this reader keeps of it.
_READS = "gpu+cpu:"


@dataclass(frozen=True)
class Spec:
    accelerator: str | None  # None: a CPU machine
    count: float
    vcpus: float | None
    memory_gib: float | None


@dataclass(frozen=True)
class Kept:
    """A remembered file: its version (URL), ETag and what was kept of it."""

    version: str | None
    etag: str | None
    body: Any


def _family(itype: str) -> str:
    return itype.split(".", 1)[0]


class AwsPublicSource:
    name = SOURCE

    def __init__(self, settings: PricingSettings, factory: sessionmaker[Session]) -> None:
        self.settings, self.factory = settings, factory
        aws = [r for r in catalog.snapshot_rows() if r.cloud == "aws"]
        # The cloud's machine specs, as the snapshot has them from
        # describe_instance_types: they win over the price list's `GPU` column.
        self.specs = {r.instance_type: Spec(r.accelerator, r.accelerator_count, r.vcpus, r.memory_gib)
                      for r in aws}
        self.zones: dict[tuple[str, str], list[str]] = {}
        for r in aws:
            if r.zone_id:
                self.zones.setdefault((r.region, r.instance_type), []).append(r.zone_id)
        self.snapshot_regions = {r.region for r in aws}

    @classmethod
    def from_settings(cls, settings: PricingSettings, factory: sessionmaker[Session]) -> AwsPublicSource:
        return cls(settings, factory)

    def fetch(self) -> SourceAnswer:
        report = QualityReport()
        with httpx.Client(timeout=self.settings.timeout, follow_redirects=True) as http:
            try:
                versions = self._json(http, INDEX, self.settings.aws_public_url, _versions)
            except httpx.TransportError as exc:
                raise SourceUnavailable(f"AWS price list unreachable at {self.settings.aws_public_url} "
                                        f"({type(exc).__name__})") from exc
            advisor = self._advisor(http, report)
            regions = self.settings.aws_public_regions or sorted(
                {r for r in versions if _REGION.fullmatch(r)} | self.snapshot_regions)
            with ThreadPoolExecutor(max_workers=self.settings.aws_region_workers,
                                    thread_name_prefix="prices-aws-public") as pool:
                answers = list(pool.map(lambda r: self._region(http, r, versions.get(r)), regions))
        rows, covered = [], []
        for region, (prices, notes) in zip(regions, answers, strict=True):
            report.counts.update(notes.counts)
            if prices is not None:
                covered.append(region)
                rows += self._rows(region, prices, advisor, report)
        if not covered:
            raise SourceUnavailable("no region's AWS price-list file could be read")
        return SourceAnswer(rows, {"aws": frozenset(covered)}, report)

    # --- one region ---------------------------------------------------------------------

    def _region(self, http: httpx.Client, region: str,
                version: str | None) -> tuple[dict[str, ListPrice] | None, QualityReport]:
        """The region's list prices (None when its file failed: it is left
        out of the refresh), and what the rules noted while reading it."""
        notes = QualityReport()
        if version is None:
            return {}, notes  # the index no longer lists it: nothing is offered there
        kept = self._load(region)
        if kept is not None and kept.version == _READS + version:
            return {t: ListPrice.from_json(v) for t, v in kept.body.items()}, notes
        url = urljoin(self.settings.aws_public_url, version.removesuffix(".json") + ".csv")
        try:
            with http.stream("GET", url) as r:
                r.raise_for_status()
                prices, published = read_offer_file(r.iter_bytes(), region, notes)
        except (httpx.HTTPError, BadOfferFile, UnicodeDecodeError) as exc:
            log.warning("prices: aws-public: %s's offer file failed (%s: %s); its offers keep their last prices",
                        region, type(exc).__name__, exc)
            notes.note("offer file failed (its region's offers keep their last prices)")
            return None, notes
        self._save(region, _READS + version, None, {t: p.to_json() for t, p in prices.items()})
        log.info("prices: aws-public: %s's offer file version %s read, %d instance types",
                 region, published or "?", len(prices))
        return prices, notes

    def _rows(self, region: str, prices: dict[str, ListPrice], advisor: dict[str, dict[str, list[int]]],
              report: QualityReport) -> list[OfferRow]:
        rows = []
        for itype, price in sorted(prices.items()):
            spec = self._spec(itype, price, report)
            if spec is None:
                continue
            saving, band = (advisor.get(region, {}).get(itype) or [None, None])[:2]
            spot = _estimate(price.ondemand, saving, report)
            value = risk.from_advisor_band(int(band)) if band is not None else None
            for zone_id in self.zones.get((region, itype)) or [None]:
                rows.append(OfferRow(
                    cloud="aws", region=region, zone=None, zone_id=zone_id, instance_type=itype,
                    accelerator=spec.accelerator, accelerator_count=spec.count, vcpus=spec.vcpus,
                    memory_gib=spec.memory_gib, spot_price=spot, ondemand_price=price.ondemand,
                    risk=value, risk_source="aws-advisor" if value is not None else None))
        return rows

    def _spec(self, itype: str, price: ListPrice, report: QualityReport) -> Spec | None:
        known = self.specs.get(itype)
        if known is not None:
            if price.gpus is not None and price.gpus != known.count:
                report.note("GPU count from the machine specs, not the price list")
            return Spec(known.accelerator, known.count, price.vcpus or known.vcpus,
                        price.memory_gib or known.memory_gib)
        # Not in the snapshot (a new size): the family's GPU, the file's count;
        # a CPU family's size (never a whole `metal` host) has none.
        if _family(itype) in FAMILY_GPU:
            return Spec(FAMILY_GPU[_family(itype)], price.gpus or 0, price.vcpus, price.memory_gib)
        return Spec(None, 0.0, price.vcpus, price.memory_gib) if aws_cpu_type(itype) else None

    # --- the small files: index and advisor, asked with If-None-Match -------------------

    def _json(self, http: httpx.Client, name: str, url: str, keep) -> Any:
        """`keep(body)` of the JSON at `url`, or what was kept of it when it
        has not changed since (304 to the ETag remembered)."""
        kept = self._load(name)
        if kept is not None and kept.version != _READS + url:
            kept = None  # kept from another URL, or by a reader that kept less of it
        headers = {"If-None-Match": kept.etag} if kept is not None and kept.etag else {}
        r = http.get(url, headers=headers)
        if r.status_code == 304 and kept is not None:
            return kept.body
        r.raise_for_status()
        body = keep(r.json())
        self._save(name, _READS + url, r.headers.get("ETag"), body)
        return body

    def _advisor(self, http: httpx.Client, report: QualityReport) -> dict[str, dict[str, list[int]]]:
        """region -> instance type -> [saving %, interruption band], from
        the feed, else from its last copy read (the feed is public and
        republished irregularly: a day without it changes little)."""
        try:
            return self._json(http, ADVISOR, self.settings.aws_advisor_url, _advice)
        except (httpx.HTTPError, ValueError, KeyError, AttributeError) as exc:
            kept = self._load(ADVISOR)
            report.note("no spot advisor feed (" + ("its last copy used" if kept else "on-demand only") + ")")
            log.info("prices: aws-public: spot advisor feed unavailable (%s)", type(exc).__name__)
            return kept.body if kept is not None else {}

    # --- what this source remembers, in the database ---------------------------------------

    def _load(self, name: str) -> Kept | None:
        with self.factory() as session:
            row = session.get(PriceListFile, (SOURCE, name))
            return None if row is None else Kept(row.version, row.etag, json.loads(row.body))

    def _save(self, name: str, version: str | None, etag: str | None, body: Any) -> None:
        values = {"version": version, "etag": etag, "body": json.dumps(body, separators=(",", ":")),
                  "fetched_at": datetime.now(UTC)}
        try:
            with transaction(self.factory) as session:
                row = session.get(PriceListFile, (SOURCE, name))
                if row is None:
                    session.add(PriceListFile(source=SOURCE, name=name, **values))
                else:
                    for k, v in values.items():
                        setattr(row, k, v)
        except IntegrityError:
            pass  # another broker saved the same file a moment ago (its lease had run out)


def _versions(index: dict[str, Any]) -> dict[str, str]:
    """region -> the URL of its current offer file (JSON; the CSV beside it)."""
    return {code: entry["currentVersionUrl"] for code, entry in index["regions"].items()}


def _advice(feed: dict[str, Any]) -> dict[str, dict[str, list[int]]]:
    """What is kept of the advisor feed: the Linux saving and band of its GPU
    instance types and CPU families' types (a few hundred entries per region
    of its tens of thousands)."""
    return {region: {t: [e.get("s"), e.get("r")] for t, e in (by_os.get("Linux") or {}).items()
                     if _family(t) in FAMILY_GPU or aws_cpu_type(t)}
            for region, by_os in feed["spot_advisor"].items()}


def _estimate(ondemand: float | None, saving: float | None, report: QualityReport) -> float | None:
    """Spot $/h from on-demand and the advisor's saving (a percent)."""
    if ondemand is None or ondemand <= 0 or saving is None:
        return None
    if not 0 < saving < 100:
        report.note("advisor saving out of range (no spot estimate)")
        return None
    return round(ondemand * (1 - saving / 100), 6)
