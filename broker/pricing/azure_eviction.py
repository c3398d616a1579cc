"""Azure spot eviction-rate bands from Resource Graph's `SpotResources`
table (REST through httpx, paged by `$skipToken`): one band per VM size and
region ("0-5", "5-10", "10-15", "15-20", "20+" percent), the published risk
of Azure's region-wide offers.

It needs Azure AD credentials (azure-identity's chain) and runs at tenant
scope; without them, or when the first page cannot be had, Azure's offers
carry no published risk (the policy's prior stays neutral there).
"""
from __future__ import annotations

import logging
from typing import Any

import httpx

from spotbroker.broker.pricing import risk
from spotbroker.broker.pricing.base import SourceUnavailable

log = logging.getLogger("spotbroker.pricing")
API_VERSION = "2024-04-01"
SCOPE = "https://management.azure.com/.default"
# `id` keeps the pages in a stable order (the API's own advice for paging).
QUERY = ("SpotResources | where type =~ 'microsoft.compute/skuspotevictionrate/location' "
         "| project id, skuName = tostring(sku.name), location, evictionRate = tostring(properties.evictionRate)")
PAGE_SIZE = 1000  # the API's largest
_MAX_PAGES = 1000


def band_risk(band: str) -> float | None:
    """"0-5" -> the advisor's first band, ..., "20+" -> its last (fraction a month)."""
    low = band.strip().rstrip("%+").split("-")[0].strip()
    return risk.from_advisor_band(int(low) // 5) if low.isdigit() else None


class EvictionRates:
    def __init__(self, credential, base_url: str | None, timeout: float) -> None:
        self.credential, self.timeout = credential, timeout
        self.url = f"{(base_url or 'https://management.azure.com').rstrip('/')}/providers/Microsoft.ResourceGraph/" \
                   f"resources?api-version={API_VERSION}"

    def bands(self) -> dict[tuple[str, str], float]:
        """(region, lower-cased VM size) -> risk; SourceUnavailable when the
        first page cannot be had, an error when a later one fails (a partial
        set of bands would make unlisted sizes look safe)."""
        from azure.core.exceptions import AzureError

        try:
            token = self.credential.get_token(SCOPE).token
        except AzureError as exc:
            raise SourceUnavailable(f"no Azure credentials for eviction rates ({type(exc).__name__})") from exc
        out: dict[tuple[str, str], float] = {}
        options: dict[str, Any] = {"$top": PAGE_SIZE, "resultFormat": "objectArray"}
        with httpx.Client(timeout=self.timeout, headers={"Authorization": f"Bearer {token}"}) as http:
            for page in range(_MAX_PAGES):
                body = self._page(http, options, page)
                for row in body.get("data") or []:
                    value = band_risk(str(row.get("evictionRate") or ""))
                    if value is not None and row.get("skuName") and row.get("location"):
                        out[(str(row["location"]).lower(), str(row["skuName"]).lower())] = value
                token_next = body.get("$skipToken")
                if not token_next:
                    return out
                options = {"$top": PAGE_SIZE, "$skipToken": token_next, "resultFormat": "objectArray"}
        raise RuntimeError(f"Azure eviction rates: more than {_MAX_PAGES} pages")

    def _page(self, http: httpx.Client, options: dict[str, Any], page: int) -> dict[str, Any]:
        try:
            r = http.post(self.url, json={"query": QUERY, "options": options})
            r.raise_for_status()
            return r.json()
        except (httpx.TransportError, httpx.HTTPStatusError, ValueError) as exc:
            if page == 0:
                raise SourceUnavailable(f"Azure Resource Graph unavailable ({type(exc).__name__})") from exc
            raise RuntimeError(f"Azure eviction rates: page {page + 1} failed ({exc})") from exc
