"""The CPU machines the live price sources list: general-purpose,
memory-optimized and compute families, the ones SkyPilot itself picks for a task without
accelerators (its catalogs' default families), so that a CPU job is priced
and placed among the machines it would be launched on. The bundled snapshot
carries a few sizes of these (catalog_data/*_vms_cpu.csv).
"""
from __future__ import annotations

import re

AWS_FAMILIES = ("m5", "m6i", "m7i", "r5", "r6i", "r7i", "c5", "c6i", "c7i")
# GCP prices a machine from its series' per-vCPU and per-GiB SKUs (gcp.py),
# named in the SKUs' descriptions ("N2 Instance Core running in Americas").
GCP_FAMILIES = ("n2-standard", "n2-highmem", "n2-highcpu", "n4-standard", "n4-highmem", "n4-highcpu")
GCP_SKU_SERIES = {"n2": "N2", "n4": "N4"}
# The series name in each Compute Engine SKU description, per machine family
# (GCP bills a GPU machine as its cores, its RAM and its GPUs).
GCP_SERIES = {"a2-highgpu": "A2", "a2-megagpu": "A2 Mega", "a2-ultragpu": "A2 Ultra", "a3-highgpu": "A3",
              "a3-edgegpu": "A3 Edge", "a3-megagpu": "A3 Mega", "a3-ultragpu": "A3 Ultra", "a4-highgpu": "A4",
              "g2-standard": "G2", "n1": "N1 Predefined"}  # n1: the host GCP's T4/V100/P100/P4 attach to (gcp_n1)
# Azure: Dsv5 (4 GiB per vCPU), Dlsv5 (2 GiB), Esv5 (memory, 8 GiB) and Fsv2 (compute, 2 GiB).
_AZURE_TYPE = re.compile(r"Standard_(?:D(?P<d>\d+)(?P<low>l?)s_v5|E(?P<e>\d+)s_v5|F(?P<f>\d+)s_v2)")
_AZURE_GIB_PER_VCPU = {"d": 4.0, "low": 2.0, "e": 8.0, "f": 2.0}


def aws_cpu_type(instance_type: str) -> bool:
    """`m6i.2xlarge` yes; `m6i.metal` (a whole host) and other families no."""
    family, _, size = instance_type.partition(".")
    return family in AWS_FAMILIES and bool(size) and size != "metal" and not size.startswith("metal-")


def gcp_cpu_type(machine_type: str) -> bool:
    """`n2-standard-8` yes; custom shapes (`n2-custom-...`) and other families no."""
    family, _, size = machine_type.rpartition("-")
    return family in GCP_FAMILIES and size.isdigit()


def gcp_family(machine_type: str) -> str:
    """`n2-standard-8` -> `n2`: the series whose core and RAM SKUs price it."""
    return machine_type.split("-", 1)[0]


def azure_cpu_type(sku_name: str) -> bool:
    return _AZURE_TYPE.fullmatch(sku_name) is not None


def azure_cpu_shape(sku_name: str) -> tuple[float, float] | None:
    """(vCPUs, GiB) of a size of these families, from its name (Azure's
    naming: the number is the vCPUs; the memory per vCPU is the family's),
    for when no subscription's resource SKUs say it."""
    match = _AZURE_TYPE.fullmatch(sku_name)
    if match is None:
        return None
    family = "low" if match["low"] else next(name for name in ("d", "e", "f") if match[name])
    vcpus = float(match["d"] or match["e"] or match["f"])
    return vcpus, vcpus * _AZURE_GIB_PER_VCPU[family]
