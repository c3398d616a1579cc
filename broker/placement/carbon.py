"""Carbon in placement: what a job's `carbon_price_per_tonne` adds to a place.

A job (or its team's default) that puts a price on a tonne of CO2e has
placement minimise dollars plus that price times the expected emissions.
A place's expected emissions per node-hour are the power its node draws
(`energy.power.estimate`, from the offer's GPUs, vCPUs and memory) times its
grid's intensity, the figure an attempt launched there now is charged at
(`energy.footprint.grid_now`: a fresh live reading, else the snapshot's).

The placer adds price × emissions to each zone's spot and on-demand prices
before the policy sees them, so the policy stays the same pure function
(observation in, decision out) the simulator measures; the placements it
launches keep their dollar prices, which the ledger charges. It decides a
second time at a carbon price of 0, and when the two decisions differ the
job's placement reason says carbon decided it and what that cost or saved
(`reason`). List-price placements are ordered by the same weighted price.

Kubernetes clusters are not weighed: the places file does not say which
grid a cluster draws from, and a made-up figure would decide for the user.
"""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from spotbroker.broker.energy import footprint, power
from spotbroker.broker.placement.policy import Action, Decision
from spotbroker.broker.pricing.offers import Placement
from spotbroker.broker.store.models import PriceOffer


def surcharge(price_per_tonne: float, kg_per_hour: float) -> float:
    """Dollars per hour that `kg_per_hour` of CO2e is worth at the price."""
    return price_per_tonne * kg_per_hour / 1000


class Emissions:
    """Each place's expected kg CO2e per node-hour, for one placement pass
    (grid figures and machine shapes are looked up once per pass)."""

    def __init__(self) -> None:
        self._grid: dict[tuple[str, str | None], float] = {}
        self._shape: dict[tuple[str, str | None], tuple[float | None, float | None]] = {}

    def kg_per_hour(self, session: Session, now: datetime, p: Placement,
                    shape: tuple[float | None, float | None] | None = None) -> float:
        """`shape`: the offer's (vCPUs, memory GiB), looked up when not given."""
        if shape is None:
            shape = self._shape_of(session, p)
        kw = power.estimate(p.cloud, p.accelerator, p.accelerator_count, *shape).kw
        key = (p.cloud, p.region)
        if key not in self._grid:
            self._grid[key] = footprint.grid_now(session, p.cloud, p.region, now)[0]
        return kw * self._grid[key] / 1000

    def _shape_of(self, session: Session, p: Placement) -> tuple[float | None, float | None]:
        key = (p.cloud, p.instance_type)
        if key not in self._shape:
            row = session.execute(select(PriceOffer.vcpus, PriceOffer.memory_gib).where(
                PriceOffer.cloud == p.cloud, PriceOffer.instance_type == p.instance_type).limit(1)).first()
            self._shape[key] = (row.vcpus, row.memory_gib) if row is not None else (None, None)
        return self._shape[key]


def _capacity(p: Placement) -> str:
    return "spot" if p.use_spot else "on-demand"


def compared(price_per_tonne: float, chosen: Placement, plain: Placement, kg_chosen: float, kg_plain: float,
             nodes: int) -> str:
    """What choosing `chosen` over the cost-only `plain` costs or saves, per hour of the job."""
    dollars = (chosen.price_per_hour - plain.price_per_hour) * nodes
    kg = (kg_plain - kg_chosen) * nodes
    return (f"carbon at ${price_per_tonne:g}/t decided it: {chosen.place} {_capacity(chosen)} instead of "
            f"{plain.place} {_capacity(plain)}, ${abs(dollars):.3f}/h {'more' if dollars >= 0 else 'less'}, "
            f"{abs(kg):.3f} kg CO2e/h {'less' if kg >= 0 else 'more'}")


def reason(price_per_tonne: float, chosen: Decision, plain: Decision, placement_of, kg_of, nodes: int) -> str | None:
    """Why carbon decided, when the decision with it differs from the cost-only
    one (None when it does not). `placement_of(offer)`: the offer's Placement
    (None when gone); `kg_of(placement)`: its kg CO2e per node-hour."""
    if chosen.action is plain.action and chosen.offers[:1] == plain.offers[:1]:
        return None
    first = [placement_of(d.offers[0]) if d.action is Action.LAUNCH and d.offers else None for d in (chosen, plain)]
    if first[0] is not None and first[1] is not None:
        return compared(price_per_tonne, first[0], first[1], kg_of(first[0]), kg_of(first[1]), nodes)
    return (f"carbon at ${price_per_tonne:g}/t decided it: {chosen.action.value} instead of "
            f"{plain.action.value}" + (f" on {first[1].place} {_capacity(first[1])}" if first[1] else ""))
