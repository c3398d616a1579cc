"""A local fake of AWS's Price List Bulk API for EC2 (served by
clouds.FakeClouds), with the real shapes at a real file's size:

- `GET /offers/v1.0/aws/AmazonEC2/current/region_index.json`: `{"formatVersion",
  "disclaimer", "publicationDate", "regions": {code: {"regionCode",
  "currentVersionUrl": "/offers/v1.0/aws/AmazonEC2/<version>/<code>/index.json"}}}`,
  with an ETag (`If-None-Match` answers 304);
- `GET /offers/v1.0/aws/AmazonEC2/<version>/<code>/index.csv`: five preamble
  lines, the header of the real files (97 columns), then rows, with a
  Content-Length. Each GPU instance type the snapshot prices in a region
  gets the rows the real file has for it (on-demand Linux, Windows, RHEL,
  SUSE, SQL Server, dedicated tenancy and hosts, capacity reservations,
  reserved terms with their upfront fees), spread among CPU instance rows
  up to `mb` megabytes a file; the wanted row's price is the snapshot's.

The file is written as it is sent, from a pre-rendered block of CPU rows
repeated, so a 300 MB file costs the fake no memory. Tests change a price
(`price`), the GPU count a file states (`gpus`), a currency, publish a new
version (`publish`), or cut a file off after some bytes (`fail_after`).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from spotbroker.broker.pricing.fakes.data import _raw

PREFIX = "/offers/v1.0/aws/AmazonEC2/"
INDEX_PATH = PREFIX + "current/region_index.json"
DISCLAIMER = ("This pricing list is for informational purposes only. All prices are subject to the additional terms "
              "included in the pricing pages on http://aws.amazon.com. All Free Tier prices are also subject to the "
              "terms included at https://aws.amazon.com/free/")
# The header of AmazonEC2's regional CSV offer files (as published in 2025).
HEADER = [
    "SKU", "OfferTermCode", "RateCode", "TermType", "PriceDescription", "EffectiveDate", "StartingRange",
    "EndingRange", "Unit", "PricePerUnit", "Currency", "RelatedTo", "LeaseContractLength", "PurchaseOption",
    "OfferingClass", "Product Family", "serviceCode", "Location", "Location Type", "Instance Type",
    "Current Generation", "Instance Family", "vCPU", "Physical Processor", "Clock Speed", "Memory", "Storage",
    "Network Performance", "Processor Architecture", "Storage Media", "Volume Type", "Max Volume Size",
    "Max IOPS/volume", "Max IOPS Burst Performance", "Max throughput/volume", "Provisioned", "Tenancy",
    "EBS Optimized", "Operating System", "License Model", "Group", "Group Description", "Transfer Type",
    "From Location", "From Location Type", "To Location", "To Location Type", "usageType", "operation",
    "AvailabilityZone", "CapacityStatus", "ClassicNetworkingSupport", "Dedicated EBS Throughput", "ECU",
    "Elastic Graphics Type", "Enhanced Networking Supported", "From Region Code", "GPU", "GPU Memory", "Instance",
    "Instance Capacity - 10xlarge", "Instance Capacity - 12xlarge", "Instance Capacity - 16xlarge",
    "Instance Capacity - 18xlarge", "Instance Capacity - 24xlarge", "Instance Capacity - 2xlarge",
    "Instance Capacity - 32xlarge", "Instance Capacity - 4xlarge", "Instance Capacity - 8xlarge",
    "Instance Capacity - 9xlarge", "Instance Capacity - large", "Instance Capacity - medium",
    "Instance Capacity - metal", "Instance Capacity - xlarge", "instanceSKU", "Intel AVX2 Available",
    "Intel AVX Available", "Intel Turbo Available", "MarketOption", "Normalization Size Factor", "Physical Cores",
    "Pre Installed S/W", "Processor Features", "Product Type", "Region Code", "Resource Type", "serviceName",
    "SnapshotArchiveFeeType", "To Region Code", "Volume API Name", "VPCNetworkingSupport",
]
# (operating system, pre-installed software, operation code, $/h added per vCPU)
_OS = [("Linux", "NA", "RunInstances", 0.0), ("Windows", "NA", "RunInstances:0002", 0.046),
       ("RHEL", "NA", "RunInstances:0010", 0.0135), ("SUSE", "NA", "RunInstances:000g", 0.0125),
       ("Linux", "SQL Std", "RunInstances:0004", 0.12), ("Ubuntu Pro", "NA", "RunInstances:0g00", 0.0044)]
# (tenancy, capacity status, usage type prefix, price factor)
_CAPACITY = [("Shared", "Used", "BoxUsage", 1.0), ("Shared", "UnusedCapacityReservation", "UnusedBox", 1.0),
             ("Shared", "AllocatedCapacityReservation", "Reservation", 0.0),
             ("Dedicated", "Used", "DedicatedUsage", 1.1), ("Host", "AllocatedHost", "HostBoxUsage", 0.0)]
# (lease, purchase option, offering class, hourly factor, upfront hours)
_RESERVED = [("1yr", "No Upfront", "standard", 0.62, 0), ("1yr", "Partial Upfront", "standard", 0.29, 4380),
             ("1yr", "All Upfront", "convertible", 0.0, 6300), ("3yr", "No Upfront", "convertible", 0.45, 0),
             ("3yr", "Partial Upfront", "standard", 0.19, 9900), ("3yr", "All Upfront", "standard", 0.0, 14600)]
_CPU_TYPES = [("m6a.large", 2, 8), ("m6a.4xlarge", 16, 64), ("c6a.xlarge", 4, 8), ("c6a.12xlarge", 48, 96),
              ("r6g.2xlarge", 8, 64), ("t3.micro", 2, 1), ("m7a.8xlarge", 32, 128), ("i4i.4xlarge", 16, 128),
              ("c7g.16xlarge", 64, 128), ("x2idn.32xlarge", 128, 2048)]
# GPU instance types the snapshot lacks, in a few regions: one of a family
# read here (region-wide, since the snapshot knows no zones for it) and one
# AMD type that is not (`g4ad`, counted as an unknown family).
EXTRA_TYPES = {"gr6.4xlarge": (16, 128, 1, 0.9), "g4ad.xlarge": (4, 16, 1, 0.37873)}  # vCPUs, GiB, GPUs, $/h
EXTRA_REGIONS = ("us-east-1", "us-west-2")


def render(values: dict[str, Any]) -> bytes:
    """One row as the files write it: every value quoted, blanks empty."""
    return (",".join(f'"{values[c]}"' if values.get(c) not in (None, "") else "" for c in HEADER) + "\n").encode()


def _usage_prefix(region: str) -> str:
    """`USW2-` for us-west-2 (us-east-1's usage types have none)."""
    if region == "us-east-1":
        return ""
    area, direction, number = region.split("-")[0], region.split("-")[1], region.split("-")[-1]
    return f"{area[:2].upper()}{direction[0].upper()}{direction[-1].upper() if len(direction) > 5 else ''}{number}-"


def _sku(*parts: Any) -> str:
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:16].upper()


def _product(region: str, itype: str, vcpus: float, memory: float, gpus: str, family: str) -> dict[str, Any]:
    return {"Product Family": "Compute Instance (bare metal)" if itype.endswith(".metal") else "Compute Instance",
            "serviceCode": "AmazonEC2", "Location": region, "Location Type": "AWS Region", "Instance Type": itype,
            "Current Generation": "Yes", "Instance Family": family, "vCPU": f"{vcpus:g}", "Memory": f"{memory:g} GiB",
            "Storage": "EBS only", "Network Performance": "Up to 25 Gigabit", "Processor Architecture": "64-bit",
            "GPU": gpus, "Instance": itype.split(".")[0], "MarketOption": "OnDemand", "Region Code": region,
            "serviceName": "Amazon Elastic Compute Cloud", "Physical Processor": "AMD EPYC 7R13 Processor",
            "Processor Features": "AMD Turbo; AVX; AVX2", "VPCNetworkingSupport": "true", "AvailabilityZone": "NA",
            "ClassicNetworkingSupport": "false", "Enhanced Networking Supported": "Yes", "License Model":
            "No License required", "Intel AVX2 Available": "No", "Intel AVX Available": "No",
            "Intel Turbo Available": "No", "Normalization Size Factor": "NA"}


def type_rows(region: str, itype: str, vcpus: float, memory: float, gpus: str, price: str, currency: str = "USD",
              family: str = "GPU instance") -> list[bytes]:
    """Every row a real file has for one instance type in one region; the
    on-demand Linux / Shared / Used one is priced `price` (text, as written)."""
    base, rows = _product(region, itype, vcpus, memory, gpus, family), []
    hourly = float(price) if price.strip() else 0.0
    for os_name, software, operation, per_vcpu in _OS:
        sku = _sku(region, itype, os_name, software)
        for tenancy, capacity, usage, factor in _CAPACITY:
            p = price if (os_name, software, tenancy, capacity) == ("Linux", "NA", "Shared", "Used") \
                else f"{(hourly + per_vcpu * vcpus) * factor:.10f}"
            product = sku if (tenancy, capacity) == ("Shared", "Used") else _sku(sku, tenancy, capacity)
            rows.append(render({**base, "SKU": product, "OfferTermCode": "JRTCKXETXF",
                                "RateCode": f"{product}.JRTCKXETXF.6YS6EN2CT7", "TermType": "OnDemand",
                                "PriceDescription": f"${p} per On Demand {os_name} {itype} Instance Hour",
                                "EffectiveDate": "2025-09-01", "StartingRange": "0", "EndingRange": "Inf",
                                "Unit": "Hrs", "PricePerUnit": p, "Currency": currency, "Tenancy": tenancy,
                                "Operating System": os_name, "Pre Installed S/W": software, "CapacityStatus": capacity,
                                "usageType": f"{_usage_prefix(region)}{usage}:{itype}", "operation": operation}))
        if software != "NA" or os_name not in ("Linux", "Windows"):
            continue
        for lease, option, offering, factor, upfront in _RESERVED:  # reserved terms: shared tenancy only
            term = _sku(lease, option, offering)[:10]
            common = {**base, "SKU": sku, "OfferTermCode": term, "TermType": "Reserved", "LeaseContractLength": lease,
                      "PurchaseOption": option, "OfferingClass": offering, "Currency": currency, "Tenancy": "Shared",
                      "Operating System": os_name, "Pre Installed S/W": "NA", "CapacityStatus": "Used",
                      "EffectiveDate": "2025-09-01", "usageType": f"{_usage_prefix(region)}BoxUsage:{itype}",
                      "operation": operation}
            rows.append(render({**common, "RateCode": f"{sku}.{term}.6YS6EN2CT7", "Unit": "Hrs",
                                "PriceDescription": f"{os_name} ({itype}) reserved instance applied",
                                "StartingRange": "0", "EndingRange": "Inf",
                                "PricePerUnit": f"{(hourly + per_vcpu * vcpus) * factor:.10f}"}))
            if upfront:
                rows.append(render({**common, "RateCode": f"{sku}.{term}.2TG2D8R56U", "Unit": "Quantity",
                                    "PriceDescription": "Upfront Fee", "PricePerUnit": f"{hourly * upfront:.0f}"}))
    return rows


def _noise_block() -> bytes:
    """About 1 MB of CPU instance rows (the same in every file), repeated
    to fill a file to its size."""
    rows = [row for itype, vcpus, memory in _CPU_TYPES
            for row in type_rows("us-east-1", itype, vcpus, memory, "NA", f"{vcpus * 0.048:.10f}",
                                 family="General purpose")]
    return b"".join(rows * max(1, (1 << 20) // len(b"".join(rows))))


@dataclass
class RegionFile:
    version: str = "20250912225308"
    mb: float = 1.0


@dataclass
class PriceListFiles:
    """The published files; the snapshot's regions by default."""

    mb: float = 1.0                                                  # each file's size, about
    files: dict[str, RegionFile] = field(default_factory=dict)
    price: dict[tuple[str, str], str] = field(default_factory=dict)     # (region, type) -> PricePerUnit text
    gpus: dict[str, str] = field(default_factory=dict)                  # type -> the file's `GPU` column
    currency: dict[tuple[str, str], str] = field(default_factory=dict)
    fail_after: dict[str, int] = field(default_factory=dict)            # region -> bytes sent before the cut
    answers: list[tuple[str, int]] = field(default_factory=list)        # (path, status) of every request

    def __post_init__(self) -> None:
        self.types: dict[str, dict[str, tuple[float, float, str]]] = {}  # region -> type -> (vcpus, memory, gpus)
        for r in _raw("aws_vms_gpu.csv") + _raw("aws_vms_cpu.csv"):
            self.types.setdefault(r["Region"], {})[r["InstanceType"]] = (
                float(r["vCPUs"]), float(r["MemoryGiB"]), f"{float(r['AcceleratorCount'] or 0):g}")
            if r["Price"]:
                self.price.setdefault((r["Region"], r["InstanceType"]), f"{float(r['Price']):.10f}")
        for region in EXTRA_REGIONS:
            for itype, (vcpus, memory, count, price) in EXTRA_TYPES.items():
                self.types[region][itype] = (vcpus, memory, str(count))
                self.price[(region, itype)] = f"{price:.10f}"
        for region in self.types:
            self.files.setdefault(region, RegionFile(mb=self.mb))
        self._noise = _noise_block()
        self._rendered: dict[str, tuple[tuple, list[bytes]]] = {}

    def publish(self, *regions: str, version: str) -> None:
        """A new version of these regions' files (all when none named)."""
        for region in regions or list(self.files):
            self.files[region].version = version

    def index(self) -> bytes:
        return json.dumps({"formatVersion": "v1.0", "disclaimer": DISCLAIMER, "publicationDate": "2025-09-12T22:53:08Z",
                           "regions": {code: {"regionCode": code,
                                              "currentVersionUrl": f"{PREFIX}{f.version}/{code}/index.json"}
                                       for code, f in sorted(self.files.items())}}, indent=2).encode()

    def _parts(self, region: str) -> tuple[list[bytes], int, int]:
        """(the file's head and GPU rows, how many noise blocks, its size)."""
        f = self.files[region]
        head = "".join(f'"{k}","{v}"\n' for k, v in (
            ("FormatVersion", "v1.0"), ("Disclaimer", DISCLAIMER), ("Publication Date", "2025-09-12T22:53:08Z"),
            ("Version", f.version), ("OfferCode", "AmazonEC2"))).encode() + render(dict(zip(HEADER, HEADER)))
        shapes = tuple((itype, vcpus, memory, self.gpus.get(itype, count), self.price.get((region, itype), ""),
                        self.currency.get((region, itype), "USD"))
                       for itype, (vcpus, memory, count) in sorted(self.types.get(region, {}).items()))
        if self._rendered.get(region, (None,))[0] != shapes:  # rendered once per state of the region's prices
            self._rendered[region] = (shapes, [row for itype, vcpus, memory, count, price, currency in shapes
                                               for row in type_rows(region, itype, vcpus, memory, count, price,
                                                                    currency, "GPU instance" if float(count)
                                                                    else "General purpose")])
        gpu = self._rendered[region][1]
        blocks = max(1, round(f.mb * (1 << 20) / len(self._noise)))
        return [head, *gpu], blocks, len(head) + sum(map(len, gpu)) + blocks * len(self._noise)

    def size(self, region: str) -> int:
        return self._parts(region)[2]

    # --- HTTP ------------------------------------------------------------------------------

    def answer(self, h: BaseHTTPRequestHandler, path: str) -> None:
        if path == INDEX_PATH:
            body = self.index()
            etag = f'"{hashlib.md5(body).hexdigest()}"'
            if h.headers.get("If-None-Match") == etag:
                return self._status(h, path, 304, {"ETag": etag})
            return self._status(h, path, 200, {"ETag": etag, "Content-Type": "application/json",
                                               "Content-Length": str(len(body))}, body)
        parts = path[len(PREFIX):].split("/")
        region = parts[1] if len(parts) == 3 and parts[2] == "index.csv" else None
        if region not in self.files or parts[0] != self.files[region].version:
            return self._status(h, path, 404, {"Content-Length": "0"})
        (head, *gpu), blocks, size = self._parts(region)
        self._status(h, path, 200, {"Content-Type": "text/csv", "Content-Length": str(size),
                                    "ETag": f'"{_sku(region, self.files[region].version)}"'})
        budget = self.fail_after.get(region, size)
        per_block = -(-len(gpu) // blocks)  # the GPU rows spread among the CPU ones
        for piece in self._stream(head, gpu, blocks, per_block):
            if budget <= len(piece):
                h.wfile.write(piece[:budget])
                break
            h.wfile.write(piece)
            budget -= len(piece)
        h.close_connection = True

    def _stream(self, head: bytes, gpu: list[bytes], blocks: int, per_block: int):
        yield head
        for i in range(blocks):
            yield self._noise
            if gpu[i * per_block:(i + 1) * per_block]:
                yield b"".join(gpu[i * per_block:(i + 1) * per_block])

    def _status(self, h: BaseHTTPRequestHandler, path: str, status: int, headers: dict[str, str],
                body: bytes = b"") -> None:
        self.answers.append((path, status))
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        if body:
            h.wfile.write(body)
