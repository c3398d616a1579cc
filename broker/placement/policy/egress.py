"""Where a zone is, and what moving a checkpoint between regions costs.

The defaults are the spot-sim protocol's rule (also AWS's list prices for
inter-region transfer): free inside a region, $0.01/GB between us-east-1 and
us-east-2, $0.02/GB between any other pair (GCP and Azure names fall through
to that rate). The broker's settings may pass another table.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_GCP_ZONE = re.compile(r"^(.+)-[a-z]$")  # us-central1-a -> us-central1
_AWS_ZONE = re.compile(r"^(.+\d)[a-z]$")  # us-east-1c -> us-east-1


def region_of(zone: str) -> str:
    """The cloud region a zone belongs to (the zone itself when no suffix is recognised).

    The broker names its places "cloud/region/zone/instance-type": the region is
    the second part."""
    if "/" in zone:
        return zone.split("/")[1]
    for pattern in (_GCP_ZONE, _AWS_ZONE):
        m = pattern.match(zone)
        if m:
            return m.group(1)
    return zone


@dataclass(frozen=True)
class EgressPrices:
    """$/GB to move a checkpoint from one region to another."""

    default_usd_per_gb: float = 0.02
    # unordered region pairs with their own rate
    pairs: dict[frozenset[str], float] = field(
        default_factory=lambda: {frozenset(("us-east-1", "us-east-2")): 0.01}
    )

    def usd_per_gb(self, from_region: str, to_region: str) -> float:
        if from_region == to_region:
            return 0.0
        return self.pairs.get(frozenset((from_region, to_region)), self.default_usd_per_gb)

    def fee(self, from_zone: str | None, to_zone: str, checkpoint_gb: float) -> float:
        """Dollars to bring the checkpoint to `to_zone`; nothing when there is none yet."""
        if from_zone is None:
            return 0.0
        return checkpoint_gb * self.usd_per_gb(region_of(from_zone), region_of(to_zone))
