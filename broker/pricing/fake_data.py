"""What the local fakes (fakes.py) answer: the clouds' own response shapes,
filled from the bundled snapshot's real rows, with the noise the real APIs
carry (Windows and Low Priority meters, CPU sizes, other currencies) so the
sources' filters are exercised. `scale` repeats the regions to reach a real
API's volume for bench/prices.py."""
from __future__ import annotations

import csv
from typing import Any

from spotbroker.broker.pricing import catalog


def _raw(name: str) -> list[dict[str, str]]:
    with catalog._open(name) as f:
        return list(csv.DictReader(f))


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
    """Retail Prices items for every GPU size of the snapshot: pay-as-you-go,
    Spot, Windows and Low Priority meters, and a CPU size beside them."""
    items = []
    for r in _raw("azure_vms_gpu.csv"):
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
    real GPU counts (the snapshot says 12 for ND96isr_H100_v5; it has 8)."""
    by_size: dict[str, dict[str, Any]] = {}
    for r in _raw("azure_vms_gpu.csv"):
        count = 8 if r["InstanceType"] == "Standard_ND96isr_H100_v5" else r["AcceleratorCount"] or "0"
        sku = by_size.setdefault(r["InstanceType"], {
            "resourceType": "virtualMachines", "name": r["InstanceType"], "tier": "Standard",
            "size": r["InstanceType"].removeprefix("Standard_"), "family": "standardNFamily",
            "locations": [], "locationInfo": [], "restrictions": [],
            "capabilities": [{"name": "vCPUs", "value": str(int(float(r["vCPUs"])))},
                             {"name": "MemoryGB", "value": r["MemoryGiB"]},
                             {"name": "GPUs", "value": str(int(float(count)))}]})
        for region in _region_copies(r["Region"], scale):
            sku["locations"].append(region)
            sku["locationInfo"].append({"location": region, "zones": ["1", "2", "3"], "zoneDetails": []})
    return list(by_size.values())
