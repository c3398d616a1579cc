"""What the local fakes (clouds.py) answer: the clouds' own response shapes,
filled from the bundled snapshot's real rows, with the noise the real APIs
carry (Windows and Low Priority meters, CPU sizes, other currencies) so the
sources' filters are exercised. `scale` repeats the regions to reach a real
API's volume for bench/prices.py."""
from __future__ import annotations

import csv
from typing import Any

from spotbroker.broker.pricing import catalog
from spotbroker.broker.pricing.cpu_families import GCP_SERIES, GCP_SKU_SERIES, gcp_cpu_type, gcp_family


def _raw(name: str) -> list[dict[str, str]]:
    with catalog._open(name) as f:
        return list(csv.DictReader(f))


def _aws_raw() -> list[dict[str, str]]:
    """The snapshot's AWS rows, GPU and CPU machines (same columns)."""
    return _raw("aws_vms_gpu.csv") + _raw("aws_vms_cpu.csv")


def _region_copies(region: str, scale: int) -> list[str]:
    return [region] + [f"{region}x{i}" for i in range(1, scale)]


# --- Azure ---------------------------------------------------------------------------------

def _azure_item(sku: str, region: str, price: float, meter: str, product: str) -> dict[str, Any]:
    return {"currencyCode": "USD", "tierMinimumUnits": 0.0, "retailPrice": price, "unitPrice": price,
            "armRegionName": region, "location": region, "effectiveStartDate": "2025-01-01T00:00:00Z",
            "meterId": f"{sku}-{region}-{meter}", "meterName": meter, "productId": "DZH318Z0BQPS",
            "skuId": "DZH318Z0BQPS/00TG", "productName": product, "skuName": meter,
            "serviceName": "Virtual Machines", "serviceId": "DZH313Z7MMC8", "serviceFamily": "Compute",
            "unitOfMeasure": "1 Hour", "type": "Consumption", "isPrimaryMeterRegion": True,
            "armSkuName": sku}


def azure_items(scale: int = 1) -> list[dict[str, Any]]:
    """Retail Prices items for every GPU and CPU size of the snapshot:
    pay-as-you-go, Spot, Windows and Low Priority meters, and a CPU size of
    a family no source lists (DSv3) beside them."""
    items = []
    for r in _raw("azure_vms_gpu.csv") + _raw("azure_vms_cpu.csv"):
        size = r["InstanceType"].removeprefix("Standard_").replace("_", " ")
        product = f"Virtual Machines {size.split()[0]} Series"
        for region in _region_copies(r["Region"], scale):
            if r["Price"]:
                items.append(_azure_item(r["InstanceType"], region, float(r["Price"]), size, product))
                items.append(_azure_item(r["InstanceType"], region, round(float(r["Price"]) * 1.4, 4), size,
                                         product + " Windows"))
            if r["SpotPrice"]:
                items.append(_azure_item(r["InstanceType"], region, float(r["SpotPrice"]), f"{size} Spot", product))
                items.append(_azure_item(r["InstanceType"], region, float(r["SpotPrice"]),
                                         f"{size} Low Priority", product))
            items.append(_azure_item("Standard_D2s_v3", region, 0.096, "D2s v3", "Virtual Machines DSv3 Series"))
    return items


def azure_skus(scale: int = 1) -> list[dict[str, Any]]:
    """`resource_skus.list()` values for the snapshot's GPU sizes, with the
    real GPU counts (the snapshot says 12 for ND96isr_H100_v5; it has 8), and
    its CPU sizes (which list no GPUs capability)."""
    by_size: dict[str, dict[str, Any]] = {}
    for r in _raw("azure_vms_gpu.csv") + _raw("azure_vms_cpu.csv"):
        count = 8 if r["InstanceType"] == "Standard_ND96isr_H100_v5" else r["AcceleratorCount"] or "0"
        gpus = [{"name": "GPUs", "value": str(int(float(count)))}] if float(count) else []
        sku = by_size.setdefault(r["InstanceType"], {
            "resourceType": "virtualMachines", "name": r["InstanceType"], "tier": "Standard",
            "size": r["InstanceType"].removeprefix("Standard_"),
            "family": "standardNFamily" if gpus else "standardDSv5Family",
            "locations": [], "locationInfo": [], "restrictions": [],
            "capabilities": [{"name": "vCPUs", "value": str(int(float(r["vCPUs"])))},
                             {"name": "MemoryGB", "value": r["MemoryGiB"]}, *gpus]})
        for region in _region_copies(r["Region"], scale):
            sku["locations"].append(region)
            sku["locationInfo"].append({"location": region, "zones": ["1", "2", "3"], "zoneDetails": []})
    return list(by_size.values())


def azure_evictions(scale: int = 1) -> list[dict[str, Any]]:
    """Resource Graph `SpotResources` eviction-rate rows for the snapshot's
    spot sizes, GPU and CPU, a band each (lower-cased names, as the table has them)."""
    bands = ("0-5", "5-10", "10-15", "15-20", "20+")
    rows = []
    for r in _raw("azure_vms_gpu.csv") + _raw("azure_vms_cpu.csv"):
        if not r["SpotPrice"]:
            continue
        for region in _region_copies(r["Region"], scale):
            sku = r["InstanceType"].lower()
            rows.append({"id": f"/subscriptions/x/providers/Microsoft.Compute/skuSpotEvictionRate/{sku}/"
                               f"location/{region}", "skuName": sku, "location": region,
                         "evictionRate": bands[sum(map(ord, sku + region)) % 5]})
    return rows


# --- GCP ----------------------------------------------------------------------------------

GCP_GPU = {"A100": "Nvidia Tesla A100", "A100-80GB": "Nvidia Tesla A100 80GB", "H100": "Nvidia H100 80GB",
           "H100-MEGA": "Nvidia H100 80GB Mega", "H200": "Nvidia H200 141GB", "B200": "Nvidia B200",
           "L4": "Nvidia L4", "T4": "Nvidia Tesla T4", "V100": "Nvidia Tesla V100", "P100": "Nvidia Tesla P100",
           "P4": "Nvidia Tesla P4"}


def _gcp_sku(n: int, description: str, group: str, usage: str, region: str, price: float,
             unit: str = "h") -> dict[str, Any]:
    units, nanos = int(price), round((price - int(price)) * 1e9)
    prefix = "Spot Preemptible " if usage == "Preemptible" else ""
    return {"name": f"services/6F81-5844-456A/skus/{n:04X}-{n * 7919 % 65536:04X}-{n % 9973:04X}",
            "skuId": f"{n:04X}-{n * 7919 % 65536:04X}-{n % 9973:04X}",
            "description": f"{prefix}{description} running in {region}",
            "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute",
                         "resourceGroup": group, "usageType": usage},
            "serviceRegions": [region],
            "pricingInfo": [{"summary": "", "effectiveTime": "2025-06-01T00:00:00Z", "currencyConversionRate": 1,
                             "pricingExpression": {
                                 "usageUnit": unit, "displayQuantity": 1, "baseUnit": "s",
                                 "usageUnitDescription": "hour" if unit == "h" else "gibibyte hour",
                                 "baseUnitDescription": "second", "baseUnitConversionFactor": 3600,
                                 "tieredRates": [{"startUsageAmount": 0, "unitPrice": {
                                     "currencyCode": "USD", "units": str(units), "nanos": nanos}}]}}],
            "serviceProviderName": "Google", "geoTaxonomy": {"type": "REGIONAL", "regions": [region]}}


def gcp_skus(scale: int = 1) -> list[dict[str, Any]]:
    """Billing Catalog SKUs whose sums give the snapshot's machine prices:
    per region, a core and a RAM SKU per series (the host price split half
    and half) and a per-GPU SKU, on-demand and Spot, among others (a disk)."""
    rows = _raw("gcp_vms_gpu.csv") + _raw("gcp_vms_cpu.csv") + _raw(catalog.GCP_N1_HOSTS)
    hosts: dict[tuple[str, str], dict[str, str]] = {}
    gpus: dict[tuple[str, str], tuple[float, str, str]] = {}
    for r in rows:
        if r["InstanceType"]:
            series = next((s for s in GCP_SERIES if r["InstanceType"].startswith(s)), None) \
                or (gcp_family(r["InstanceType"]) if gcp_cpu_type(r["InstanceType"]) else None)
            key = (series, r["Region"])
            if series and float(r["vCPUs"]) > float(hosts.get(key, {"vCPUs": "0"})["vCPUs"]):
                hosts[key] = r
        elif r["AcceleratorName"] in GCP_GPU:
            count = float(r["AcceleratorCount"])
            key = (r["AcceleratorName"], r["Region"])
            # The per-GPU price from the 8-GPU row (else the largest): the
            # snapshot rounds each row to 5 digits, so a larger count loses least.
            old = gpus.get(key, (0.0, "", ""))[0]
            if old != 8 and (count == 8 or count > old):
                gpus[key] = (count, r["Price"], r["SpotPrice"])
    skus, n = [], 1
    for region_copy in range(scale):
        suffix = f"x{region_copy}" if region_copy else ""
        for (series, region), r in sorted(hosts.items()):
            for usage, column in (("OnDemand", "Price"), ("Preemptible", "SpotPrice")):
                if not r[column]:
                    continue
                host = float(r[column])
                core, ram = host / 2 / float(r["vCPUs"]), host / 2 / float(r["MemoryGiB"])
                name = {**GCP_SERIES, **GCP_SKU_SERIES}[series]
                skus.append(_gcp_sku(n, f"{name} Instance Core", "CPU", usage, region + suffix, core))
                skus.append(_gcp_sku(n + 1, f"{name} Instance Ram", "RAM", usage, region + suffix, ram, "GiBy.h"))
                n += 2
        for (gpu, region), (count, price, spot) in sorted(gpus.items()):
            for usage, value in (("OnDemand", price), ("Preemptible", spot)):
                if value:
                    skus.append(_gcp_sku(n, f"{GCP_GPU[gpu]} GPU", "GPU", usage, region + suffix,
                                         float(value) / count))
                    n += 1
            skus.append(_gcp_sku(n, "Storage PD Capacity", "PDStandard", "OnDemand", region + suffix, 0.04,
                                 "GiBy.mo"))
            n += 1
    return skus


# --- AWS ----------------------------------------------------------------------------------

def aws_products(scale: int = 1) -> list[dict[str, Any]]:
    """Pricing API products (`get_products`) with the snapshot's on-demand prices."""
    seen, out = set(), []
    for r in _aws_raw():
        for region in _region_copies(r["Region"], scale):
            if not r["Price"] or (r["InstanceType"], region) in seen:
                continue
            seen.add((r["InstanceType"], region))
            sku = f"{abs(hash((r['InstanceType'], region))) % 10**12:012d}"
            out.append({"product": {"productFamily": "Compute Instance", "sku": sku, "attributes": {
                "instanceType": r["InstanceType"], "regionCode": region, "operatingSystem": "Linux",
                "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used", "servicecode": "AmazonEC2",
                "vcpu": str(int(float(r["vCPUs"]))), "memory": f"{float(r['MemoryGiB']):g} GiB",
                "gpu": str(int(float(r["AcceleratorCount"] or 0)))}},
                "serviceCode": "AmazonEC2", "version": "20251101000000", "publicationDate": "2025-11-01T00:00:00Z",
                "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {
                    "offerTermCode": "JRTCKXETXF", "sku": sku, "effectiveDate": "2025-11-01T00:00:00Z",
                    "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                        "unit": "Hrs", "endRange": "Inf", "beginRange": "0", "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7",
                        "description": f"${r['Price']} per On Demand Linux {r['InstanceType']} Instance Hour",
                        "pricePerUnit": {"USD": r["Price"]}}}, "termAttributes": {}}}}})
    return out


def aws_spot_prices() -> dict[tuple[str, str], float]:
    """(zone id, instance type) -> the snapshot's spot price."""
    return {(r["AvailabilityZone"], r["InstanceType"]): float(r["SpotPrice"])
            for r in _aws_raw() if r["SpotPrice"] and float(r["SpotPrice"]) > 0}


def aws_advisor() -> dict[str, Any]:
    """The Spot Instance Advisor feed's shape: a band and a saving over
    on-demand (55-89 %) per (region, type)."""
    feed: dict[str, Any] = {}
    for r in _aws_raw():
        band = sum(map(ord, r["InstanceType"] + r["Region"])) % 5
        saving = 55 + sum(map(ord, r["Region"] + r["InstanceType"])) % 35
        feed.setdefault(r["Region"], {"Linux": {}, "Windows": {}})["Linux"][r["InstanceType"]] = {"s": saving,
                                                                                                 "r": band}
    return {"global_rate": "<10%", "ranges": [{"index": i, "label": label, "dots": i, "max": m} for i, (label, m) in
                                              enumerate([("<5%", 5), ("5-10%", 11), ("10-15%", 16),
                                                         ("15-20%", 22), (">20%", 100)])],
            "spot_advisor": feed}


# GCP's names of the GPUs (accelerator types, and a machine type's `accelerators`).
GCP_ACCELERATOR_TYPE = {"A100": "nvidia-tesla-a100", "A100-80GB": "nvidia-a100-80gb", "H100": "nvidia-h100-80gb",
                        "H100-MEGA": "nvidia-h100-mega-80gb", "H200": "nvidia-h200-141gb", "B200": "nvidia-b200",
                        "L4": "nvidia-l4", "T4": "nvidia-tesla-t4", "V100": "nvidia-tesla-v100",
                        "P100": "nvidia-tesla-p100", "P4": "nvidia-tesla-p4"}
_GCP_LINK = "https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}"


def _zone_copies(zone: str, region: str, scale: int) -> list[str]:
    return [c + zone[len(region):] for c in _region_copies(region, scale)]


def gcp_machine_types(scale: int = 1, project: str = "fake-project") -> list[tuple[str, dict[str, Any]]]:
    """(zone, `machineTypes` entry) for every GPU, N1 and CPU machine type of the
    snapshot in each zone it lists, with a CPU machine type of a family no
    source lists (e2) in each zone beside them, as `machineTypes.aggregatedList`
    answers them."""
    out, zones = [], set()
    for n, r in enumerate(_raw("gcp_vms_gpu.csv")):
        shape = catalog.gcp_host_gpu(r["InstanceType"]) if r["InstanceType"] else None
        if shape is None:
            continue
        for zone in _zone_copies(r["AvailabilityZone"], r["Region"], scale):
            zones.add(zone)
            out.append((zone, _machine_type(n, r["InstanceType"], float(r["vCPUs"]), float(r["MemoryGiB"]), zone,
                                            project, (GCP_ACCELERATOR_TYPE[shape[0]], shape[1]))))
    for n, r in enumerate(_raw("gcp_vms_cpu.csv") + _raw(catalog.GCP_N1_HOSTS)):
        for zone in _zone_copies(r["AvailabilityZone"], r["Region"], scale):
            zones.add(zone)
            out.append((zone, _machine_type(n, r["InstanceType"], float(r["vCPUs"]), float(r["MemoryGiB"]), zone,
                                            project, None)))
    out += [(zone, _machine_type(0, "e2-standard-8", 8, 32, zone, project, None)) for zone in sorted(zones)]
    return out


def _machine_type(n: int, name: str, vcpus: float, memory_gib: float, zone: str, project: str,
                  gpu: tuple[str, int] | None) -> dict[str, Any]:
    entry = {"kind": "compute#machineType", "id": str(800000 + n), "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
             "name": name, "description": f"{int(vcpus)} vCPUs, {memory_gib:g} GB RAM", "guestCpus": int(vcpus),
             "memoryMb": int(memory_gib * 1024), "imageSpaceGb": 0, "maximumPersistentDisks": 128,
             "maximumPersistentDisksSizeGb": "263168", "zone": zone, "isSharedCpu": False,
             "selfLink": _GCP_LINK.format(project=project, zone=zone) + f"/machineTypes/{name}",
             "architecture": "X86_64"}
    if gpu is not None:
        entry["accelerators"] = [{"guestAcceleratorType": gpu[0], "guestAcceleratorCount": gpu[1]}]
    return entry


def gcp_accelerator_types(scale: int = 1, project: str = "fake-project") -> list[tuple[str, dict[str, Any]]]:
    """(zone, `acceleratorTypes` entry): each GPU in every zone the snapshot
    prices it or a machine type carrying it."""
    pairs = set()
    for r in _raw("gcp_vms_gpu.csv"):
        shape = catalog.gcp_host_gpu(r["InstanceType"]) if r["InstanceType"] else None
        gpu = shape[0] if shape else r["AcceleratorName"]
        if gpu in GCP_ACCELERATOR_TYPE:
            pairs.update((z, gpu) for z in _zone_copies(r["AvailabilityZone"], r["Region"], scale))
    out = []
    for i, (zone, gpu) in enumerate(sorted(pairs)):
        link, name = _GCP_LINK.format(project=project, zone=zone), GCP_ACCELERATOR_TYPE[gpu]
        out.append((zone, {"kind": "compute#acceleratorType", "id": str(10000 + i), "name": name,
                           "creationTimestamp": "1969-12-31T16:00:00.000-08:00", "description": f"NVIDIA {gpu}",
                           "zone": link, "selfLink": f"{link}/acceleratorTypes/{name}",
                           "maximumCardsPerInstance": 16 if gpu == "A100" else 8}))
    return out
