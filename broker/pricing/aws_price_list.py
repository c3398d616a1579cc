"""One region's EC2 offer file from AWS's Price List Bulk API, read as it
streams in: the on-demand hourly list price and specs of each GPU instance
type and of each type of the CPU families (cpu_families.py), and nothing else.

A file is hundreds of MB (us-east-1's about 300 MB): a few preamble lines
(`"FormatVersion","v1.0"`, `"Disclaimer",…`, `"Publication Date",…`,
`"Version",…`, `"OfferCode","AmazonEC2"`), then a header (`"SKU",
"OfferTermCode","RateCode","TermType",…,"Instance Type",…,"GPU",…`), then
one row per SKU and price term: every instance type, operating system,
tenancy, capacity status and reserved term. Each row is ~700 bytes and
almost none is wanted, so a line is parsed as CSV only when a search over
the bytes finds a wanted instance type's shared-tenancy usage in it; the file
is never held whole.
"""
from __future__ import annotations

import csv
import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from spotbroker.broker.pricing.cpu_families import AWS_FAMILIES
from spotbroker.broker.pricing.normalise import QualityReport

# The GPU of each NVIDIA instance family, for instance types the bundled
# snapshot does not know (for those it knows, its machine specs win).
# Left out on purpose: fractional GPUs (g6f, gr6f: a slice of an L4 is not
# an L4), AMD (g4ad) and Gaudi/Trainium/Inferentia (not CUDA GPUs), and the
# GB200 UltraServers (sold as capacity blocks, not by the hour).
FAMILY_GPU = {
    "p3": "V100", "p3dn": "V100-32GB", "p4d": "A100", "p4de": "A100-80GB", "p5": "H100", "p5e": "H200",
    "p5en": "H200", "p6-b200": "B200", "p6-b300": "B300", "g4dn": "T4", "g5": "A10G", "g5g": "T4g",
    "g6": "L4", "gr6": "L4", "g6e": "L40S",
}
# Shared-tenancy instance hours are billed as `BoxUsage:<type>` (as
# `USE2-BoxUsage:p4d.24xlarge` outside us-east-1): every row that can be the
# wanted one has it in its `usageType`, and one row in five or so has it
# (a search for a GPU family's usage finds a few hundred rows in a file).
_BOX = re.compile(rb'BoxUsage:([a-z0-9-]+)\.[a-z0-9]+"')
_FAMILIES = b"|".join(re.escape(f.encode()) for f in sorted((*FAMILY_GPU, *AWS_FAMILIES), key=len, reverse=True))
_WANTED_BOX = re.compile(rb'BoxUsage:(?:' + _FAMILIES + rb')\.[a-z0-9]+"')
# The term we price: plain Linux on shared hardware, paid by the hour.
_WANTED = {"TermType": "OnDemand", "Operating System": "Linux", "Tenancy": "Shared", "Pre Installed S/W": "NA",
           "CapacityStatus": "Used", "Unit": "Hrs"}
_COLUMNS = (*_WANTED, "Instance Type", "PricePerUnit", "Currency", "vCPU", "Memory", "GPU")


@dataclass(frozen=True)
class ListPrice:
    """One instance type's on-demand list price ($/h, None when blank)
    and the specs the file gives (the `GPU` count is the file's own)."""

    ondemand: float | None
    vcpus: float | None
    memory_gib: float | None
    gpus: float | None

    def to_json(self) -> list[float | None]:
        return [self.ondemand, self.vcpus, self.memory_gib, self.gpus]

    @classmethod
    def from_json(cls, values: list[float | None]) -> ListPrice:
        return cls(*values)


class BadOfferFile(ValueError):
    """The file is not an EC2 offer file as this reader knows them."""


def _number(text: str) -> float | None:
    """`"96"`, `"1152 GiB"`, `"32.7726000000"` -> the number; blank, `NA` -> None."""
    head = text.split(" ", 1)[0].replace(",", "")
    try:
        return float(head)
    except ValueError:
        return None


def _lower(price: float | None, than: float | None) -> bool:
    """A real price below `than` (zero and blank are no price at all)."""
    return price is not None and price > 0 and (than is None or than <= 0 or price < than)


def _fields(line: bytes) -> list[str]:
    return next(csv.reader([line.rstrip(b"\r").decode("utf-8")]))


def read_offer_file(chunks: Iterable[bytes], region: str, report: QualityReport) -> tuple[dict[str, ListPrice], str]:
    """(instance type -> its list price, the file's `Version`) from the
    file's bytes as they arrive. Raises BadOfferFile on a file that is not
    an offer file as read here; a transfer that breaks off raises the HTTP
    client's error from `chunks`, and nothing of it is kept."""
    chunks = iter(chunks)
    preamble, header, rest = _head(chunks, region)
    scan = _Scan(header, region, report)
    for chunk in itertools.chain([rest], chunks):
        rest = scan.lines(rest + chunk)
    scan.lines(rest + b"\n")
    return scan.finish(), preamble.get("Version", "")


def _head(chunks: Iterator[bytes], region: str) -> tuple[dict[str, str], list[str], bytes]:
    """The preamble (`"Version","2025…"`…), the header, and the bytes after it."""
    preamble: dict[str, str] = {}
    buf = b""
    while len(preamble) < 50:
        nl = buf.find(b"\n")
        if nl < 0:
            chunk = next(chunks, None)
            if chunk is None or len(buf) > 1 << 20:
                break
            buf += chunk
            continue
        fields = _fields(buf[:nl]) if buf[:nl].strip() else []
        buf = buf[nl + 1:]
        if fields[:1] == ["SKU"]:
            missing = [c for c in _COLUMNS if c not in fields]
            if missing:
                raise BadOfferFile(f"{region}'s offer file has no column {missing}")
            return preamble, fields, buf
        if len(fields) == 2:
            preamble[fields[0]] = fields[1]
    raise BadOfferFile(f"no header line in {region}'s offer file")


class _Scan:
    """The rows after the header, a buffer of whole lines at a time: the
    usage-type search runs over the buffer in C, and only the lines it
    finds are looked at in Python."""

    def __init__(self, header: list[str], region: str, report: QualityReport) -> None:
        self.col = {name: i for i, name in enumerate(header)}
        self.width, self.region, self.report = len(header), region, report
        self.out: dict[str, ListPrice] = {}
        self.unknown: set[str] = set()   # GPU families not read (AMD, Gaudi, new ones): said once each
        self.gpu_rows = self.gpu_box_rows = 0

    def lines(self, data: bytes) -> bytes:
        """Read the whole lines of `data`; the unfinished last one is returned."""
        end = data.rfind(b"\n") + 1
        for match in _WANTED_BOX.finditer(data, 0, end):
            start = data.rfind(b"\n", 0, match.start()) + 1
            self.row(data[start:data.find(b"\n", match.end())])
        # The other GPU instance rows: families this reader leaves out.
        at = data.find(b'"GPU instance"', 0, end)
        while at >= 0:
            start, stop = data.rfind(b"\n", 0, at) + 1, data.find(b"\n", at)
            self.gpu_rows += 1
            box = _BOX.search(data, start, stop)
            if box is not None:
                self.gpu_box_rows += 1
                if box[1].decode() not in FAMILY_GPU:
                    self.unknown.add(box[1].decode())
            at = data.find(b'"GPU instance"', stop, end)
        return data[end:]

    def row(self, line: bytes) -> None:
        fields, col = _fields(line), self.col
        if len(fields) != self.width:
            self.report.note("malformed price-list line")
            return
        if any(fields[col[c]] != v for c, v in _WANTED.items()):
            return
        if "MarketOption" in col and fields[col["MarketOption"]] not in ("OnDemand", ""):
            return  # capacity blocks and the like are not hourly on-demand
        if "Region Code" in col and fields[col["Region Code"]] not in (self.region, ""):
            return  # a Local Zone's row
        if fields[col["Currency"]] != "USD":
            self.report.note(f"not in USD ({fields[col['Currency']] or 'blank'})")
            return
        itype = fields[col["Instance Type"]]
        price = ListPrice(_number(fields[col["PricePerUnit"]]), _number(fields[col["vCPU"]]),
                          _number(fields[col["Memory"]]), _number(fields[col["GPU"]]))
        old = self.out.get(itype)
        if old is not None:
            if old.ondemand != price.ondemand:
                self.report.note("two on-demand prices for one instance type (the lower kept)")
            if not _lower(price.ondemand, old.ondemand):
                return
        self.out[itype] = price

    def finish(self) -> dict[str, ListPrice]:
        if self.gpu_rows and not self.gpu_box_rows:
            # GPU rows, none found by their usage type: the file's shape
            # changed, and an empty answer would unlist the whole region.
            raise BadOfferFile(f"{self.region}'s offer file has GPU rows but none billed as BoxUsage")
        for family in sorted(self.unknown):
            self.report.note(f"GPU family not read ({family})")
        return self.out
