"""The checkpoint interval fitted to a place: pure arithmetic, no database.

A spot instance in a zone is reclaimed at some rate λ; checkpointing every
τ seconds, at a cost of C seconds each (the stall plus the persist time the
library measures), loses on average τ/2 of work per reclaim and C per
checkpoint. Young and Daly's first-order optimum is τ = √(2·C·MTBF), with
MTBF = 1/λ; it is bounded here to [1 min, 2 h].

The zone's MTBF is a conjugate estimate: a Gamma prior on λ worth
`PRIOR_RECLAIMS` reclaims over `PRIOR_RECLAIMS × prior MTBF` seconds,
updated by what the broker saw there (the exposure time of its spot
instances and how many were reclaimed). The estimate is the posterior's
exposure over reclaims, (β + T) / (α + n): a zone never seen keeps the
prior, a few reclaims move it. The prior's MTBF is the bundled traces'
pooled spot lifetime (`TRACES_MTBF_S`), scaled by the zone's published
interruption risk (Spot Advisor band, Azure eviction band) relative to a
typical zone, within bounds: a monthly band ranks zones, it does not give
this model's spell length.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

MIN_INTERVAL_S = 60.0
MAX_INTERVAL_S = 7200.0
# Both bundled trace sets (data/traces/aws-v100-2023 and aws-v100-4node-600s),
# every available spell as a spot instance's life: 6,791 h over 1,980
# reclaims (bench/checkpoint_interval.py prints it).
TRACES_MTBF_S = 3.43 * 3600
PRIOR_RECLAIMS = 1.0  # a weak prior: one reclaim's worth, so a zone's own record soon outweighs it
TYPICAL_RISK = 0.10  # AWS's advisor: the average spot interruption rate is under 10 % a month
RISK_SCALE_BOUNDS = (0.25, 4.0)
# Until the job's first periodic checkpoint is measured: a few GB to object storage.
ASSUMED_COST_S = 30.0


@dataclass(frozen=True)
class ZoneRecord:
    """What the broker saw of its spot instances in one zone."""

    exposure_s: float = 0.0  # their running time, summed
    reclaims: int = 0  # how many of them were reclaimed
    risk: float | None = None  # published fraction interrupted per month, if any


def prior_mtbf_s(risk: float | None) -> float:
    if risk is None:
        return TRACES_MTBF_S
    low, high = RISK_SCALE_BOUNDS
    scale = high if risk <= 0 else min(high, max(low, TYPICAL_RISK / risk))
    return TRACES_MTBF_S * scale


def mtbf_s(record: ZoneRecord) -> float:
    """The zone's time between reclaims: the Gamma posterior's (β + T) / (α + n)."""
    beta = PRIOR_RECLAIMS * prior_mtbf_s(record.risk)
    return (beta + max(0.0, record.exposure_s)) / (PRIOR_RECLAIMS + max(0, record.reclaims))


def young_daly(cost_s: float, mtbf: float) -> float:
    """√(2·C·MTBF), bounded to [MIN_INTERVAL_S, MAX_INTERVAL_S]."""
    raw = math.sqrt(2.0 * max(cost_s, 0.0) * max(mtbf, 0.0))
    return min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, raw))


def expected_waste_fraction(interval_s: float, cost_s: float, mtbf: float) -> float:
    """First-order share of time lost: C/τ for checkpoints plus τ/(2·MTBF) for reclaims."""
    return cost_s / interval_s + interval_s / (2.0 * mtbf)


def changed(old_s: float | None, new_s: float, tolerance: float = 0.1) -> bool:
    """Worth telling the library: more than `tolerance` away from what is in force."""
    return old_s is None or abs(new_s - old_s) > tolerance * old_s
