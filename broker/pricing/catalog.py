"""The bundled snapshot of real SkyPilot catalog rows: the offer source that
needs no credentials. GPU machines, and a few general-purpose and compute
CPU types (`*_vms_cpu.csv`) where jobs without accelerators run.

The rows are real and carry real traps (see catalog_data/README.md): blank
and zero prices, spot above on-demand by rounding, GCP host and GPU prices in
separate rows, a wrong GPU count. Each is handled here, once.
"""
from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from importlib import resources
from typing import TextIO

from spotbroker.broker.pricing import gcp_n1

SOURCE = "catalog"
GCP_N1_HOSTS = "gcp_vms_n1.csv"  # the N1 sizes GCP's T4, V100, P100 and P4 attach to


@dataclass(frozen=True)
class OfferRow:
    cloud: str
    region: str
    zone: str | None
    zone_id: str | None
    instance_type: str
    accelerator: str | None
    accelerator_count: float
    vcpus: float | None
    memory_gib: float | None
    spot_price: float | None
    ondemand_price: float | None
    # Published interruption risk, a fraction of spot VMs interrupted per
    # month (live sources only; see broker/pricing/risk.py).
    risk: float | None = None
    risk_source: str | None = None


def _price(text: str) -> float | None:
    """Blank and zero (a placeholder in the catalog) both mean "unknown"."""
    text = (text or "").strip()
    if not text:
        return None
    value = float(text)
    return value if value > 0 else None


def _num(text: str) -> float | None:
    text = (text or "").strip()
    return float(text) if text else None


def _capped(spot: float | None, ondemand: float | None) -> float | None:
    # SpotPrice has 6 decimals and Price fewer, so rounding makes spot look
    # above on-demand in some rows: spot is never worth more than on-demand.
    if spot is not None and ondemand is not None and spot > ondemand:
        return ondemand
    return spot


def _open(name: str) -> TextIO:
    return resources.files("spotbroker.broker.pricing").joinpath("catalog_data", name).open(encoding="utf-8")


def aws_rows(f: TextIO) -> Iterator[OfferRow]:
    for r in csv.DictReader(f):
        ondemand, spot = _price(r["Price"]), _price(r["SpotPrice"])
        if ondemand is None and spot is None:
            continue
        yield OfferRow(
            cloud="aws", region=r["Region"], zone=None, zone_id=r["AvailabilityZone"] or None,
            instance_type=r["InstanceType"], accelerator=r["AcceleratorName"] or None,
            accelerator_count=_num(r["AcceleratorCount"]) or 0, vcpus=_num(r["vCPUs"]),
            memory_gib=_num(r["MemoryGiB"]), spot_price=_capped(spot, ondemand), ondemand_price=ondemand,
        )


# GCP prices a GPU machine as its host row plus the GPU add-on row.
_GCP_FAMILY_GPU = [
    ("a2-highgpu-", "A100"), ("a2-megagpu-", "A100"), ("a2-ultragpu-", "A100-80GB"),
    ("a3-highgpu-", "H100"), ("a3-edgegpu-", "H100"), ("a3-megagpu-", "H100-MEGA"),
    ("a3-ultragpu-", "H200"), ("a4-highgpu-", "B200"), ("g2-standard-", "L4"),
]
_G2_L4_COUNT = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}


def gcp_host_gpu(instance_type: str) -> tuple[str, int] | None:
    for prefix, gpu in _GCP_FAMILY_GPU:
        if instance_type.startswith(prefix):
            rest = instance_type[len(prefix):]
            if gpu == "L4":
                count = _G2_L4_COUNT.get(int(rest)) if rest.isdigit() else None
            else:
                match = re.match(r"(\d+)g", rest)
                count = int(match[1]) if match else None
            return (gpu, count) if count else None
    return None


def _sum_prices(host: dict[str, str], addon: dict[str, str], column: str) -> float | None:
    host_price, gpu_price = _price(host[column]), _price(addon[column])
    return None if host_price is None or gpu_price is None else round(host_price + gpu_price, 6)


def gcp_rows(f: TextIO, n1_hosts: TextIO | None = None) -> Iterator[OfferRow]:
    """GPU machines: each host type that comes with its GPUs, and each N1
    size with the GPUs it may carry (`gcp_n1`), priced with the GPUs' add-on
    rows of the zone."""
    machines, gpus = [], {}
    for r in csv.DictReader(f):
        if r["InstanceType"]:
            if shape := gcp_host_gpu(r["InstanceType"]):
                machines.append((r, *shape, r["InstanceType"]))
        else:
            key = (r["AcceleratorName"], float(r["AcceleratorCount"]), r["AvailabilityZone"])
            gpus[key] = r
    for r in csv.DictReader(n1_hosts) if n1_hosts is not None else ():
        machines += [(r, gpu, count, gcp_n1.offer_type(r["InstanceType"], gpu, count))
                     for gpu in gcp_n1.SIZES for count in gcp_n1.shapes(gpu)
                     if gcp_n1.fits(gpu, count, float(r["vCPUs"]), float(r["MemoryGiB"]))]
    for h, gpu_name, count, instance_type in machines:
        addon = gpus.get((gpu_name, float(count), h["AvailabilityZone"]))
        if addon is None:
            continue

        ondemand, spot = _sum_prices(h, addon, "Price"), _sum_prices(h, addon, "SpotPrice")
        if ondemand is None and spot is None:
            continue
        yield OfferRow(
            cloud="gcp", region=h["Region"], zone=h["AvailabilityZone"], zone_id=None,
            instance_type=instance_type, accelerator=gpu_name, accelerator_count=float(count),
            vcpus=_num(h["vCPUs"]), memory_gib=_num(h["MemoryGiB"]),
            spot_price=_capped(spot, ondemand), ondemand_price=ondemand,
        )


# Rows whose accelerator is missing or wrong in the catalog.
_AZURE_FIXES = {"Standard_ND96isr_H100_v5": ("H100", 8.0), "Standard_NCC40ads_H100_v5": ("H100", 1.0)}


def azure_rows(f: TextIO) -> Iterator[OfferRow]:
    for r in csv.DictReader(f):
        name, count = r["AcceleratorName"] or None, _num(r["AcceleratorCount"]) or 0
        if r["InstanceType"] in _AZURE_FIXES:
            name, count = _AZURE_FIXES[r["InstanceType"]]
        elif name is None and "_A10_v4" in r["InstanceType"]:
            name = "A10"
        if name is None or not count:
            continue  # FPGA and unnamed GPUs: nothing a job can ask for
        ondemand, spot = _price(r["Price"]), _price(r["SpotPrice"])
        if ondemand is None and spot is None:
            continue
        yield OfferRow(
            cloud="azure", region=r["Region"], zone=None, zone_id=None,
            instance_type=r["InstanceType"], accelerator=name, accelerator_count=float(count),
            vcpus=_num(r["vCPUs"]), memory_gib=_num(r["MemoryGiB"]),
            spot_price=_capped(spot, ondemand), ondemand_price=ondemand,
        )


def _cpu_row(cloud: str, r: dict[str, str], zone: str | None, zone_id: str | None) -> OfferRow | None:
    ondemand, spot = _price(r["Price"]), _price(r["SpotPrice"])
    if ondemand is None and spot is None:
        return None
    return OfferRow(
        cloud=cloud, region=r["Region"], zone=zone, zone_id=zone_id, instance_type=r["InstanceType"],
        accelerator=None, accelerator_count=0.0, vcpus=_num(r["vCPUs"]), memory_gib=_num(r["MemoryGiB"]),
        spot_price=_capped(spot, ondemand), ondemand_price=ondemand,
    )


def cpu_rows(cloud: str, f: TextIO) -> Iterator[OfferRow]:
    """The CPU-only rows of a cloud's catalog file (no accelerator, vCPUs
    given): the places a job without accelerators runs. A GCP GPU host
    (a2, g2...) or an Azure N-series type is never one, whatever its row says."""
    for r in csv.DictReader(f):
        if r.get("AcceleratorName") or not r.get("InstanceType") or not _num(r.get("vCPUs", "")):
            continue
        if cloud == "gcp" and gcp_host_gpu(r["InstanceType"]) is not None:
            continue
        if cloud == "azure" and r["InstanceType"].startswith("Standard_N"):
            continue
        zone = r.get("AvailabilityZone") or None
        row = _cpu_row(cloud, r, zone if cloud == "gcp" else None, zone if cloud == "aws" else None)
        if row is not None:
            yield row


@lru_cache(maxsize=1)
def snapshot_date() -> date | None:
    """The day the snapshot was cut (catalog_data/SNAPSHOT_DATE, written when
    it is made): its prices are at least this old, whenever the broker last
    re-read them. None when the file is missing or unreadable."""
    try:
        with _open("SNAPSHOT_DATE") as f:
            return date.fromisoformat(f.read().strip())
    except (OSError, ValueError):
        return None


def snapshot_rows() -> list[OfferRow]:
    return list(_snapshot())


@lru_cache(maxsize=1)
def _snapshot() -> tuple[OfferRow, ...]:
    """Read once per process: the files are in the package and the rows
    immutable, and every broker start (every test server) seeds from them."""
    rows: list[OfferRow] = []
    for cloud in ("aws", "gcp", "azure"):
        with _open(f"{cloud}_vms_cpu.csv") as f:
            rows.extend(cpu_rows(cloud, f))
    for name, parse in (("aws_vms_gpu.csv", aws_rows), ("azure_vms_gpu.csv", azure_rows)):
        with _open(name) as f:
            rows.extend(parse(f))
    with _open("gcp_vms_gpu.csv") as f, _open(GCP_N1_HOSTS) as n1:
        rows.extend(gcp_rows(f, n1))
    return tuple(rows)
