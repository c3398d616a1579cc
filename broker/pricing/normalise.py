"""One name per GPU across the clouds, and the data-quality rules every
source's rows pass before they become offers.

The names are the catalog's (SkyPilot's): `A100` is the 40 GB part,
`A100-80GB` the 80 GB one, `H100`, `L4`… so that one query finds all three
clouds' A100s whatever each cloud calls them.
"""
from __future__ import annotations

import logging
import math
import re
from collections import Counter
from dataclasses import replace
from functools import lru_cache

from spotbroker.broker.pricing.catalog import OfferRow

log = logging.getLogger("spotbroker.pricing")

# Lower-cased spellings of the clouds' own names -> the one name. Checked in
# order, most specific first (`a100 80gb` before `a100`).
_ALIASES: list[tuple[str, str]] = [
    (r"h100[- a-z0-9]*mega", "H100-MEGA"),
    (r"a100[- ]?80\s*gb", "A100-80GB"),
    (r"a100[- ]?40\s*gb", "A100"),
    (r"v100[- ]?32\s*gb", "V100-32GB"),
    (r"v100[- ]?16\s*gb", "V100"),
    (r"gh200", "GH200"),
    (r"h200", "H200"),
    (r"h100", "H100"),
    (r"b200", "B200"),
    (r"b300", "B300"),
    (r"a100", "A100"),
    (r"l40s", "L40S"),
    (r"l40", "L40"),
    (r"l4", "L4"),
    (r"a10g", "A10G"),
    (r"a10", "A10"),
    (r"t4g", "T4g"),
    (r"t4", "T4"),
    (r"v100", "V100"),
    (r"p100", "P100"),
    (r"p4", "P4"),
    (r"k80", "K80"),
    (r"m60", "M60"),
]


@lru_cache(maxsize=4096)  # a refresh asks for the same few spellings thousands of times
def accelerator_name(raw: str | None) -> str | None:
    """`nvidia-tesla-a100` (GCP), `NVIDIA A100 80GB` (AWS GpuInfo), `A100`
    (the catalog) → the one name; a name not in the table stays as it is."""
    if not raw or not raw.strip():
        return None
    text = _plain(raw)
    for pattern, name in _ALIASES:
        if re.search(rf"(^|[^a-z0-9]){pattern}($|[^a-z0-9])", text):
            return name
    return raw.strip()


@lru_cache(maxsize=4096)
def asked_accelerator(raw: str) -> str:
    """A name a job, a price query or a team's allowlist gives → the one name,
    when the whole of it spells one (`a100`, `A100-80GB`, `nvidia-tesla-t4`);
    else itself, which no offer has, so that it is refused naming the closest.
    Not a search, as for the clouds' own spellings: `A100-80G` was read as
    `A100` with a suffix ignored, and ran on 40 GB parts."""
    text = _plain(raw).strip(" -")
    for pattern, name in _ALIASES:
        if re.fullmatch(pattern, text):
            return name
    return raw.strip()


def _plain(raw: str) -> str:
    """A spelling with the vendor's words left out: `NVIDIA Tesla_T4` -> ` -t4`."""
    return raw.lower().replace("nvidia", "").replace("tesla", "").replace("_", "-")


def is_cpu(row: OfferRow) -> bool:
    """A machine without accelerators: where a job that asks for none runs."""
    return not (row.accelerator or "").strip() and not row.accelerator_count


class QualityReport:
    """What the rules dropped or changed in one refresh, by reason (logged
    once per refresh, and returned for `spotbroker prices --refresh`)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def note(self, reason: str) -> None:
        self.counts[reason] += 1

    def __str__(self) -> str:
        return ", ".join(f"{n} {reason}" for reason, n in sorted(self.counts.items())) or "nothing"


def _positive(price: float | None) -> float | None:
    """Blank, zero (a placeholder), negative and NaN all mean "unknown"."""
    if price is None or not math.isfinite(price) or price <= 0:
        return None
    return price


def clean(row: OfferRow, report: QualityReport, currency: str = "USD") -> OfferRow | None:
    """The row as an offer, or None with the reason noted. No offer is ever
    priced at $0, and spot is never worth more than on-demand. A CPU row
    (no accelerator at all) is an offer when it says how many vCPUs it has."""
    if currency != "USD":
        report.note(f"not in USD ({currency})")
        return None
    if is_cpu(row):
        if not row.vcpus or row.vcpus <= 0:
            report.note("no vCPU count")
            return None
        name = None
    else:
        name = accelerator_name(row.accelerator)
        if name is None:
            report.note("no known GPU")
            return None
        if not row.accelerator_count or row.accelerator_count <= 0:
            report.note("no GPU count")
            return None
    spot, ondemand = _positive(row.spot_price), _positive(row.ondemand_price)
    if (row.spot_price is not None and spot is None) or (row.ondemand_price is not None and ondemand is None):
        report.note("placeholder zero price")
    if spot is None and ondemand is None:
        report.note("no price")
        return None
    if spot is None:
        report.note("no spot price (on-demand only)")
    if spot is not None and ondemand is not None and spot >= ondemand:
        # A spot price at or above on-demand is either rounding or a market
        # gone thin: AWS caps what a spot VM is charged at on-demand.
        report.note("spot at or above on-demand (capped)")
        spot = ondemand
    return replace(row, accelerator=name, spot_price=spot, ondemand_price=ondemand)
