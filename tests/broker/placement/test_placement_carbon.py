"""Placement with a carbon price (`carbon_price_per_tonne`): dollars plus the
price of the expected emissions decide, on a database whose V100 offers lie
in two regions of very different grids (eu-north-1, 8.8 g CO2e/kWh in the
snapshot; ap-south-1, 708.2), on both databases."""
from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import select, update
from support.helpers import run_to_end

from spotbroker.broker import auth
from spotbroker.broker.clock import Clock
from spotbroker.broker.energy import grid, power
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.placement.placer import Placer
from spotbroker.broker.placement.policy import Action
from spotbroker.broker.pricing import store
from spotbroker.broker.pricing.catalog import OfferRow
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Attempt, Event, Job, PriceOffer
from spotbroker.broker.usecases import jobs

CLEAN, DIRTY = "eu-north-1", "ap-south-1"
V100 = {"accelerators": "V100:1"}


def offers(factory, prices: dict[str, float], ondemand: dict[str, float] | None = None) -> int:
    """p3.2xlarge offers at these spot prices (on-demand $3.06, or `ondemand`); the team's id."""
    rows = [OfferRow(cloud="aws", region=region, zone=f"{region}a", zone_id=None, instance_type="p3.2xlarge",
                     accelerator="V100", accelerator_count=1, vcpus=8, memory_gib=61, spot_price=spot,
                     ondemand_price=(ondemand or {}).get(region, 3.06))
            for region, spot in prices.items()]
    with transaction(factory) as s:
        store.apply_refresh(s, "aws", rows, datetime.now(UTC), {"aws": None})
        # only these two places (the broker's start-up loads the bundled catalog's)
        s.execute(update(PriceOffer).where(PriceOffer.source != "aws").values(listed=False))
        team, _ = auth.create_team(s, "green")
        return team.id


def kg_per_hour(region: str) -> float:
    return power.estimate("aws", "V100", 1, 8, 61).kw * grid.intensity("aws", region).g_per_kwh / 1000


def choose(factory, settings, team_id: int, **spec_fields):
    spec = JobSpec.model_validate({"run": "x", "resources": V100, **spec_fields})
    with transaction(factory) as s:
        job_id = jobs.submit(s, team_id, spec).id
    with factory() as s:
        return Placer(settings).choose(s, s.get(Job, job_id), spec, Clock().now())


def test_an_equally_priced_cleaner_region_wins_with_a_carbon_price_and_not_without(factory, settings):
    team = offers(factory, {CLEAN: 0.90, DIRTY: 0.90})
    plain = choose(factory, settings, team)
    assert plain.action is Action.LAUNCH and plain.placements[0].region == DIRTY  # the tie goes to the first name
    assert "carbon" not in plain.reason
    green = choose(factory, settings, team, carbon_price_per_tonne=100)
    assert green.action is Action.LAUNCH and green.placements[0].region == CLEAN
    assert green.placements[0].price_per_hour == 0.90 and green.placements[0].use_spot  # dollars, as launched
    saved = kg_per_hour(DIRTY) - kg_per_hour(CLEAN)
    assert saved > 0.25  # ~0.27 kg CO2e an hour: a V100 node at 0.39 kW on grids 700 g/kWh apart
    assert (f"carbon at $100/t decided it: aws/{CLEAN}/{CLEAN}a spot instead of aws/{DIRTY}/{DIRTY}a spot, "
            f"$0.000/h more, {saved:.3f} kg CO2e/h less") in green.reason


def test_a_slightly_dearer_cleaner_region_wins_at_a_high_carbon_price_only(factory, settings):
    team = offers(factory, {CLEAN: 0.95, DIRTY: 0.90})  # $0.05/h dearer: worth it above ~$185/t
    assert choose(factory, settings, team).placements[0].region == DIRTY
    low = choose(factory, settings, team, carbon_price_per_tonne=100)  # the emissions worth $0.027/h
    assert low.placements[0].region == DIRTY and "carbon" not in low.reason
    high = choose(factory, settings, team, carbon_price_per_tonne=500)  # worth $0.135/h
    assert high.placements[0].region == CLEAN and high.placements[0].price_per_hour == 0.95
    assert "carbon at $500/t decided it" in high.reason and "$0.050/h more" in high.reason


def test_list_price_placements_are_ordered_by_the_same_weighed_price(factory, settings):
    team = offers(factory, {CLEAN: 0.95, DIRTY: 0.90}, ondemand={CLEAN: 3.10, DIRTY: 3.06})
    on_demand = {"accelerators": "V100:1", "use_spot": False}
    plain = choose(factory, settings, team, resources=on_demand)
    assert [p.region for p in plain.placements] == [DIRTY, CLEAN] and plain.reason == "list price"
    green = choose(factory, settings, team, resources=on_demand, carbon_price_per_tonne=500)
    assert [p.region for p in green.placements] == [CLEAN, DIRTY] and not green.placements[0].use_spot
    assert green.reason.startswith("list price; carbon at $500/t decided it") and "$0.040/h more" in green.reason


def test_the_reconciler_launches_where_carbon_chose_at_the_dollar_price_and_says_why(factory, settings,
                                                                                    agent_endpoint):
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    team = offers(factory, {CLEAN: 0.90, DIRTY: 0.90})
    with transaction(factory) as s:
        job_id = jobs.submit(s, team, JobSpec.model_validate(
            {"run": "true", "resources": V100, "carbon_price_per_tonne": 100})).id
    run_to_end(factory, settings, job_id, timeout=30)
    with factory() as s:
        (attempt,) = s.scalars(select(Attempt).where(Attempt.job_id == job_id))
        launched = next(e.data for e in s.scalars(select(Event).where(Event.job_id == job_id))
                        if e.type == "job_state" and (e.data or {}).get("to") == "LAUNCHING")
        assert s.get(Job, job_id).state == "SUCCEEDED"
    assert (attempt.region, attempt.use_spot, attempt.price_per_hour) == (CLEAN, True, 0.90)  # the ledger's price
    assert attempt.grid_g_per_kwh == pytest.approx(grid.intensity("aws", CLEAN).g_per_kwh)
    assert launched["region"] == CLEAN and "carbon at $100/t decided it" in launched["why"]
    assert "kg CO2e/h less" in launched["why"]
