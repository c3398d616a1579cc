"""Offers: price samples per machine shape and place, and the first
placement rule — the cheapest feasible offer.

The price sources (broker/pricing/) keep one current row per offer
(`price_offers`) and a history sample each time a price changes (`offers`);
placement reads the current rows that their source still lists.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from spotbroker.broker.clock import SYSTEM_CLOCK, Clock
from spotbroker.broker.jobs.spec import Infra, JobSpec, ResourceSet, parse_amount
from spotbroker.broker.pricing import catalog, normalise, store
from spotbroker.broker.store.models import PriceOffer

OfferKey = tuple[str, str, str | None, str]  # cloud, region, zone name or id, instance type


@dataclass(frozen=True)
class Placement:
    """Where one attempt goes, and what it costs per node-hour."""

    cloud: str
    region: str | None
    zone: str | None
    zone_id: str | None
    instance_type: str | None
    accelerator: str | None
    accelerator_count: float
    use_spot: bool
    price_per_hour: float

    @property
    def place(self) -> str:
        """The zone-level place used for cool-downs (zone name, id, or region)."""
        return f"{self.cloud}/{self.region}/{self.zone or self.zone_id or '*'}"


LOCAL_PLACEMENT = Placement(cloud="local", region=None, zone=None, zone_id=None, instance_type=None,
                            accelerator=None, accelerator_count=0, use_spot=False, price_per_hour=0.0)


def record_samples(session: Session, rows: Iterable[catalog.OfferRow], source: str,
                   observed_at: datetime) -> int:
    """Apply a source's complete answer for every cloud in it; the offers written."""
    rows = list(rows)
    scope: store.Scope = {r.cloud: None for r in rows}
    result = store.apply_refresh(session, source, rows, observed_at, scope)
    return result.new + result.changed


def seed_from_catalog(session: Session, clock: Clock = SYSTEM_CLOCK) -> int:
    """Load the bundled snapshot once, so that placement works with no credentials."""
    if session.get_bind().dialect.name == "postgresql":
        # Brokers starting together on one database must not all load it.
        session.execute(text("SELECT pg_advisory_xact_lock(7040)"))
    if session.scalar(select(func.count()).select_from(PriceOffer).where(PriceOffer.source == catalog.SOURCE)):
        return 0
    return record_samples(session, catalog.snapshot_rows(), catalog.SOURCE, clock.now())


def current_offers(session: Session, accelerator: str, count: float) -> list[PriceOffer]:
    """The current, listed offers with exactly this accelerator shape, in the
    order they were first listed (ties in price keep that order). Sorted
    here: an ORDER BY id would lead SQLite off the shape index."""
    rows = session.scalars(
        select(PriceOffer)
        .where(PriceOffer.accelerator == normalise.accelerator_name(accelerator),
               PriceOffer.accelerator_count == count, PriceOffer.listed.is_(True)))
    return sorted(rows, key=lambda o: o.id)


def _fits(offer: PriceOffer, want: ResourceSet, infra: Infra | None) -> bool:
    if infra is not None:
        if infra.cloud and offer.cloud != infra.cloud:
            return False
        if infra.region and offer.region != infra.region:
            return False
        if infra.zone and infra.zone not in (offer.zone, offer.zone_id):
            return False
    if want.instance_type is not None and offer.instance_type != want.instance_type:
        return False
    regions = want.image_regions  # an image per region: only those regions have the job's image
    if regions is not None and offer.region not in regions:
        return False
    for wanted, have in ((want.cpus, offer.vcpus), (want.memory, offer.memory_gib)):
        if wanted is not None:
            amount, at_least = parse_amount(wanted)
            if have is None or (have < amount if at_least else have != amount):
                return False
    return True


def feasible_offers(session: Session, spec: JobSpec) -> list[tuple[PriceOffer, ResourceSet]]:
    """Every current offer that fits one of the job's resource sets, with the set.

    `any_of` alternatives all count; of `ordered` ones only the first that
    has a feasible offer does (a later one is taken only when every earlier
    one has none).
    """
    groups: list[list[tuple[PriceOffer, ResourceSet]]] = []
    for want in spec.resources.alternatives():
        shape = want.accelerator
        if shape is not None:
            offers = current_offers(session, *shape)
        elif want.instance_type is not None:  # the type says what it carries
            offers = sorted(session.scalars(select(PriceOffer).where(
                PriceOffer.instance_type == want.instance_type, PriceOffer.listed.is_(True))), key=lambda o: o.id)
        else:
            continue
        infra = Infra(want.infra) if want.infra else None
        groups.append([(o, want) for o in offers if _fits(o, want, infra)])
    if spec.resources.is_ordered:
        return next((g for g in groups if g), [])
    return [pair for g in groups for pair in g]


def placement_of(offer: PriceOffer, want: ResourceSet, use_spot: bool) -> Placement | None:
    """The offer as a placement on spot or on-demand, if it has that price and
    the price is within the resource set's cap."""
    price = offer.spot_price if use_spot else offer.ondemand_price
    if price is None or (want.max_price_per_hour is not None and price > want.max_price_per_hour):
        return None
    return Placement(cloud=offer.cloud, region=offer.region, zone=offer.zone, zone_id=offer.zone_id,
                     instance_type=offer.instance_type, accelerator=offer.accelerator,
                     accelerator_count=offer.accelerator_count, use_spot=use_spot, price_per_hour=price)


def rank_offers(session: Session, spec: JobSpec, *, exclude_places: frozenset[str] = frozenset(),
                limit: int = 20) -> list[Placement]:
    """Feasible placements for a GPU job at list price, cheapest first (each
    resource set on spot or on-demand as it asks). Places in `exclude_places`
    (cool-downs after a capacity error) are skipped."""
    found = [p for offer, want in feasible_offers(session, spec)
             if (p := placement_of(offer, want, want.use_spot)) is not None and p.place not in exclude_places]
    found.sort(key=lambda p: (p.price_per_hour, p.cloud, p.region or "", p.zone or p.zone_id or ""))
    return found[:limit]
