"""Published spot interruption signals, as one number: the fraction of spot
VMs interrupted per month. It is a prior (broker/placement/policy/), never a fact: the
policy's own observations of a zone update it.

- AWS Spot Instance Advisor: band `r` 0..4 = <5 %, 5-10 %, 10-15 %, 15-20 %,
  >20 % interrupted per month; each band is read as its middle.
- AWS spot placement score: 1 (unlikely to get and keep capacity) .. 10
  (very likely); read linearly from 0 % at 10 to 22.5 % at 1.
- Azure eviction-rate bands (0-5 %, 5-10 %, ...) read as the advisor's.
"""
from __future__ import annotations

ADVISOR_BANDS = (0.025, 0.075, 0.125, 0.175, 0.25)


def from_advisor_band(band: int) -> float | None:
    return ADVISOR_BANDS[band] if 0 <= band < len(ADVISOR_BANDS) else None


def from_placement_score(score: int) -> float | None:
    return round((10 - score) * 0.025, 4) if 1 <= score <= 10 else None


def combine(*risks: float | None) -> float | None:
    """The worst published signal (each source sees only part of the risk)."""
    known = [r for r in risks if r is not None]
    return max(known) if known else None
