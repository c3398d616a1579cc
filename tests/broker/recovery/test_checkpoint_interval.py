"""The fitted checkpoint interval's arithmetic (broker/recovery/interval.py)."""
from __future__ import annotations

import math

import pytest

from spotbroker.broker.recovery import interval as iv


def test_the_interval_shrinks_as_a_zones_reclaim_rate_rises():
    cost = 20.0
    calm = iv.young_daly(cost, iv.mtbf_s(iv.ZoneRecord(exposure_s=40 * 3600, reclaims=2)))
    stormy = iv.young_daly(cost, iv.mtbf_s(iv.ZoneRecord(exposure_s=40 * 3600, reclaims=40)))
    assert stormy < calm
    # more reclaims over the same exposure: never a longer interval
    steps = [iv.young_daly(cost, iv.mtbf_s(iv.ZoneRecord(10 * 3600, n))) for n in range(0, 30)]
    assert all(b <= a for a, b in zip(steps, steps[1:])) and steps[-1] < steps[0]


def test_a_zone_never_seen_keeps_the_prior_and_its_record_soon_outweighs_it():
    assert iv.mtbf_s(iv.ZoneRecord()) == pytest.approx(iv.TRACES_MTBF_S)
    seen = iv.mtbf_s(iv.ZoneRecord(exposure_s=300 * 600.0, reclaims=300))  # reclaimed every 10 min
    assert seen == pytest.approx(600.0, rel=0.1)


def test_a_published_risk_scales_the_prior_within_bounds():
    assert iv.prior_mtbf_s(0.25) < iv.prior_mtbf_s(0.10) < iv.prior_mtbf_s(0.025)
    assert iv.prior_mtbf_s(10.0) == pytest.approx(iv.TRACES_MTBF_S * iv.RISK_SCALE_BOUNDS[0])
    assert iv.prior_mtbf_s(0.0) == pytest.approx(iv.TRACES_MTBF_S * iv.RISK_SCALE_BOUNDS[1])


def test_young_daly_is_the_optimum_of_the_first_order_waste_and_is_bounded():
    cost, mtbf = 12.0, 3 * 3600.0
    best = iv.young_daly(cost, mtbf)
    assert best == pytest.approx(math.sqrt(2 * cost * mtbf))
    waste = iv.expected_waste_fraction
    assert waste(best, cost, mtbf) < min(waste(best * 0.8, cost, mtbf), waste(best * 1.25, cost, mtbf))
    assert iv.young_daly(0.01, 600.0) == iv.MIN_INTERVAL_S
    assert iv.young_daly(3600.0, 1e9) == iv.MAX_INTERVAL_S


def test_a_small_move_is_not_worth_telling():
    assert iv.changed(None, 300.0)
    assert not iv.changed(300.0, 320.0)
    assert iv.changed(300.0, 250.0)
