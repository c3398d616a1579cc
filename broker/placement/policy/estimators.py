"""What the policy believes about each zone, learned from what it has observed.

Spot capacity in a zone is modelled as an on/off process with exponential
spells: up spells of mean U (so a running spot instance is reclaimed at rate
1/U) and down spells of mean D. Each mean is the textbook maximum-likelihood
estimate, time seen in that state over the number of spells seen to end,
with a weak, optimistic prior worth one spell: a zone never tried looks
good enough to be worth a try (the way bandit algorithms explore), and a
few hours of watching outweigh it. Censored spells (still going) count
through their time, which is what keeps the estimate unbiased for
exponential spells.

Where a cloud publishes a zone's interruption risk, the prior's up spell is
scaled by it relative to a typical zone: a monthly band says how zones
compare, not how long the spells of this model are, so the scale is
relative and bounded, and a zone with no published risk keeps the neutral
prior (the traces carry none, so their figures do not move).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from spotbroker.broker.placement.policy.model import ZoneHistory

# One pseudo-spell each: round numbers, not fitted to any trace.
PRIOR_UP_S = 4 * 3600.0
PRIOR_DOWN_S = 0.5 * 3600.0
PRIOR_SPELLS = 1.0
# A typical zone's published risk (AWS's advisor puts the average spot
# interruption rate under 10 % a month); the prior's scale is bounded to
# [1/4, 4] of the neutral one.
TYPICAL_RISK = 0.10
RISK_SCALE_BOUNDS = (0.25, 4.0)


def prior_up_s(risk: float | None) -> float:
    """The prior's mean up spell for a zone with this published risk."""
    if risk is None or risk <= 0:
        return PRIOR_UP_S if risk is None else PRIOR_UP_S * RISK_SCALE_BOUNDS[1]
    low, high = RISK_SCALE_BOUNDS
    return PRIOR_UP_S * min(high, max(low, TYPICAL_RISK / risk))


@dataclass(frozen=True)
class ZoneEstimate:
    up_mean_s: float  # U: expected length of a spot spell (a launched instance's life)
    down_mean_s: float  # D: expected length of an outage


def estimate(history: ZoneHistory, risk: float | None = None) -> ZoneEstimate:
    up = (history.seconds_up + prior_up_s(risk) * PRIOR_SPELLS) / (history.ups_lost + PRIOR_SPELLS)
    down = (history.seconds_down + PRIOR_DOWN_S * PRIOR_SPELLS) / (history.downs_ended + PRIOR_SPELLS)
    return ZoneEstimate(up, down)


MIN_SPELLS = 8  # fewer observed spells than this and the exponential model stands in


@dataclass(frozen=True)
class SpellOutlook:
    """What a spot instance launched now is expected to give, given how long its
    spell has already lasted (real spells are far from memoryless: many end
    within minutes, the survivors last for hours)."""

    productive_s: float  # E[time it runs after the restart overhead, up to the job's end]
    billed_s: float  # E[time it runs at all, up to the job's end]
    p_lost: float  # P(it is reclaimed before the job ends)


def spell_outlook(spells: list[tuple[float, float]], age_s: float, restart_s: float, work_s: float,
                  up_mean_s: float) -> SpellOutlook:
    """Empirical residual life from the observed spells (length, weight) that
    outlived `age_s`; the exponential (mean `up_mean_s`) when too few did."""
    horizon = work_s + restart_s
    residual = [(s - age_s, w) for s, w in spells if s > age_s]
    n = sum(w for _, w in residual)
    if n >= MIN_SPELLS:
        productive = sum(w * max(0.0, min(r, horizon) - restart_s) for r, w in residual) / n
        billed = sum(w * min(r, horizon) for r, w in residual) / n
        lost = sum(w for r, w in residual if r < horizon) / n
        return SpellOutlook(productive, billed, lost)
    U = up_mean_s
    return SpellOutlook(U * (math.exp(-restart_s / U) - math.exp(-horizon / U)), U * (1 - math.exp(-horizon / U)),
                        1 - math.exp(-horizon / U))


def survival(spells: list[tuple[float, float]], age_s: float, step_s: float, up_mean_s: float) -> float:
    """P(a spell that has lasted `age_s` lasts `step_s` more)."""
    longer = [(s, w) for s, w in spells if s > age_s]
    n = sum(w for _, w in longer)
    if n >= MIN_SPELLS:
        return sum(w for s, w in longer if s > age_s + step_s) / n
    return math.exp(-step_s / up_mean_s)
