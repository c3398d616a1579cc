"""Offers: price samples per machine shape and place, and the first
placement rule — the cheapest feasible offer.

The price sources (broker/pricing/) keep one current row per offer
(`price_offers`) and a history sample each time a price changes (`offers`);
placement reads the current rows that their source still lists.

Placement never needs every feasible offer: the policy weighs the cheapest
few, and a launch round tries a handful. So the database answers "the k
cheapest that fit" (every filter of a resource set is a WHERE clause, and
the shape index `(accelerator, accelerator_count, listed, spot_price)`
serves the order), and only the columns placement reads are loaded, as
plain rows rather than ORM objects. With 50,000 offers this is a millisecond
where loading every fitting offer cost a tenth of a second.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Select, func, literal, or_, select, text, union
from sqlalchemy.engine import Row
from sqlalchemy.orm import Session

from spotbroker.broker.clock import SYSTEM_CLOCK, Clock
from spotbroker.broker.jobs import resfields
from spotbroker.broker.jobs.resources import Infra, ResourceSet, parse_amount
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.pricing import catalog, normalise, store
from spotbroker.broker.store.models import PriceOffer

OfferKey = tuple[str, str, str | None, str]  # cloud, region, zone name or id, instance type
# What placement reads of an offer (`OfferRow`s below carry these attributes).
OFFER_COLUMNS = (PriceOffer.id, PriceOffer.cloud, PriceOffer.region, PriceOffer.zone, PriceOffer.zone_id,
                 PriceOffer.instance_type, PriceOffer.accelerator, PriceOffer.accelerator_count,
                 PriceOffer.vcpus, PriceOffer.memory_gib, PriceOffer.spot_price, PriceOffer.ondemand_price,
                 PriceOffer.risk)
OfferRow = Row  # a row of OFFER_COLUMNS


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
    order they were first listed (for inspection; placement reads `cheapest`)."""
    rows = session.scalars(
        select(PriceOffer)
        .where(PriceOffer.accelerator == normalise.asked_accelerator(accelerator),
               PriceOffer.accelerator_count == count, PriceOffer.listed.is_(True)))
    return sorted(rows, key=lambda o: o.id)


# What SkyPilot gives a task that names no accelerator and no instance type
# (its catalogs' `get_default_instance_type`): at least 8 vCPUs when it names
# neither cpus nor memory, and at least 4 GiB per vCPU when it names no memory.
CPU_DEFAULT_CPUS = "8+"
CPU_DEFAULT_GIB_PER_VCPU = 4.0


AWS_ZONE_NAME = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d[a-z]$")  # us-east-1a (an ID: use1-az1)


def fitting(want: ResourceSet) -> list | None:
    """The WHERE clauses of the current offers that fit a resource set (its
    shape or instance type, infra, image regions, cpus and memory; not its
    price cap), or None when it asks for the broker's host (`infra: local`).
    A set with neither an accelerator nor a type fits the CPU machines."""
    steps = _fitting_steps(want)
    return None if steps is None else [clause for _, clauses in steps for clause in clauses]


def why_unfit(session: Session, want: ResourceSet) -> str | None:
    """What of a resource set no current offer has: the first of its
    constraints, taken in turn, after which none is left (None when some
    offer fits, or the set is not for the clouds' offers)."""
    steps = _fitting_steps(want)
    if steps is None or (want.infra and Infra(want.infra).cloud == "k8s"):
        return None
    where: list = []
    for words, clauses in steps:
        where += clauses
        if not any_fits(session, where):
            return words
    cap = want.max_price_per_hour
    if cap is not None and not any(any_fits(session, priced(where, want, spot=spot, ondemand=not spot))
                                   for spot in (True, False)):
        least = session.scalar(select(func.min(func.coalesce(PriceOffer.spot_price, PriceOffer.ondemand_price)))
                               .where(*where))
        cheapest_is = f" (the cheapest: ${least:.2f}/h)" if least is not None else ""
        return f"{_nothing(want)} costs at most ${cap:g}/h{cheapest_is}"
    return None


def why_none_fits(session: Session, spec: JobSpec) -> str | None:
    """What its resource sets lack, for a job that nothing fits ("; " between sets)."""
    whys = [why for want in spec.resources.alternatives() if (why := why_unfit(session, want)) is not None]
    return "; ".join(dict.fromkeys(whys)) or None


def _nothing(want: ResourceSet) -> str:
    """What a set's unmet constraint is said of: `no offer of 8 A100 per node`."""
    if want.accelerator is not None:
        return f"no offer of {want.accelerator[1]:g} {normalise.asked_accelerator(want.accelerator[0])} per node"
    return "no offer" if want.instance_type is not None else "no CPU machine"


def _fitting_steps(want: ResourceSet) -> list[tuple[str, list]] | None:
    """`fitting`'s clauses in named steps: what a user would be told lacks."""
    shape = want.accelerator
    if want.infra and Infra(want.infra).cloud == "local":
        return None
    cpus, none = want.cpus, _nothing(want)
    if shape is not None:
        name = normalise.asked_accelerator(shape[0])
        steps = [(f"no offer has {name}", [PriceOffer.accelerator == name, PriceOffer.listed.is_(True)]),
                 (f"no offer has {shape[1]:g} {name} per node", [PriceOffer.accelerator_count == shape[1]])]
    elif want.instance_type is not None:  # the type says what it carries
        steps = [("no offer is listed", [PriceOffer.listed.is_(True)])]
    else:
        steps = [("no CPU machine is offered", [PriceOffer.accelerator.is_(None), PriceOffer.accelerator_count == 0,
                                                 PriceOffer.listed.is_(True)])]
        if want.memory is None:
            steps.append(("no CPU machine has 4 GiB per vCPU",
                          [PriceOffer.memory_gib >= CPU_DEFAULT_GIB_PER_VCPU * PriceOffer.vcpus]))
            cpus = cpus or CPU_DEFAULT_CPUS
    if want.instance_type is not None:  # an N1 type is its offers with GPUs too (gcp_n1)
        steps.append((f"{none} is instance type {want.instance_type}",
                      [or_(PriceOffer.instance_type == want.instance_type,
                           PriceOffer.instance_type.startswith(want.instance_type + "+", autoescape=True))]))
    if want.image_regions is not None:  # an image per region: only those regions have the job's image
        steps.append((f"{none} is in the image's regions ({', '.join(sorted(want.image_regions))})",
                      [PriceOffer.region.in_(list(want.image_regions))]))
    if want.infra:
        infra = Infra(want.infra)
        place = []
        if infra.cloud:
            place.append(PriceOffer.cloud == infra.cloud)
        if infra.region:
            place.append(PriceOffer.region == infra.region)
        words = f"{none} is in {want.infra}"
        if infra.zone:
            # An AWS zone name is this account's: offers from the live AWS prices carry it beside the
            # zone's ID; the bundled catalog's (and SkyPilot's) name zones by ID only.
            named = select(PriceOffer.zone_id).where(PriceOffer.zone == infra.zone, PriceOffer.zone_id.is_not(None))
            place.append(or_(PriceOffer.zone == infra.zone, PriceOffer.zone_id == infra.zone,
                             PriceOffer.zone_id.in_(named)))
            if infra.cloud in (None, "aws") and AWS_ZONE_NAME.match(infra.zone):
                words += (" (AWS zone names are known from this account's live AWS prices; without them "
                          "offers name AWS zones by ID: name the zone's ID, such as use1-az1, or the region only)")
        steps.append((words, place))
    if refusing := resfields.clouds_refusing(want):  # a disk or network tier those places cannot give
        steps.append((f"{none} gives its disk or network tier ({', '.join(refusing)} cannot)",
                      [PriceOffer.cloud.not_in(refusing)]))
    for field, wanted, have in (("cpus", cpus, PriceOffer.vcpus), ("memory", want.memory, PriceOffer.memory_gib)):
        if wanted is not None:
            amount, at_least = parse_amount(wanted)
            steps.append((f"{none} has {field} {wanted}",
                          [have >= amount if at_least else have == amount]))  # NULL fits neither
    return steps


def priced(where: list, want: ResourceSet, *, spot: bool, ondemand: bool) -> list:
    """`where` narrowed to offers with the named prices, each within the set's cap."""
    out = list(where)
    for wanted, price in ((spot, PriceOffer.spot_price), (ondemand, PriceOffer.ondemand_price)):
        if wanted:
            out.append(price.is_not(None))
            if want.max_price_per_hour is not None:
                out.append(price <= want.max_price_per_hour)
    return out


def any_fits(session: Session, where: list) -> bool:
    return session.execute(select(literal(1)).where(*where).limit(1)).first() is not None


def cheapest(session: Session, where: list, price, k: int, *more: tuple) -> list[OfferRow]:
    """The offers matching `where` whose `price` is at most the k-th cheapest
    one's (ties at the cut all come, so the caller's own ordering decides
    among them), in the order they were first listed. `more` adds (price, k)
    pairs: the offers within any of the cuts, in one statement (on
    PostgreSQL a statement is a round trip and a plan)."""
    def within(price, k: int) -> Select:
        kth: Select = select(price).where(*where).order_by(price).offset(k - 1).limit(1)
        cut = func.coalesce(kth.scalar_subquery(), float("inf")) if k > 0 else literal(None)
        return select(*OFFER_COLUMNS).where(*where, price <= cut)
    parts = [within(price, k), *(within(p, n) for p, n in more)]
    statement = parts[0] if len(parts) == 1 else union(*parts)  # UNION: an offer within two cuts comes once
    return sorted(session.execute(statement).all(), key=lambda o: o.id)


def groups_of(session: Session, spec: JobSpec) -> list[tuple[ResourceSet, list]]:
    """The resource sets that compete, each with its WHERE clauses: every
    `any_of` alternative; of `ordered` ones only the first with a fitting
    offer (priced or not, within its cap or not)."""
    sets = [(want, where) for want in spec.resources.alternatives() if (where := fitting(want)) is not None]
    if spec.resources.is_ordered:
        return next(([(w, where)] for w, where in sets if any_fits(session, where)), [])
    return sets


def placement_of(offer, want: ResourceSet, use_spot: bool) -> Placement | None:
    """The offer (an ORM offer or an `OfferRow`) as a placement on spot or
    on-demand, if it has that price and the price is within the resource
    set's cap."""
    price = offer.spot_price if use_spot else offer.ondemand_price
    if price is None or (want.max_price_per_hour is not None and price > want.max_price_per_hour):
        return None
    return Placement(cloud=offer.cloud, region=offer.region, zone=offer.zone, zone_id=offer.zone_id,
                     instance_type=offer.instance_type, accelerator=offer.accelerator,
                     accelerator_count=offer.accelerator_count, use_spot=use_spot, price_per_hour=price)


def _ranked_key(p: Placement):
    return p.price_per_hour, p.cloud, p.region or "", p.zone or p.zone_id or ""


def rank_offers(session: Session, spec: JobSpec, *, exclude_places: frozenset[str] = frozenset(),
                limit: int = 20) -> list[Placement]:
    """Feasible placements for a job at list price, cheapest first (each
    resource set on spot or on-demand as it asks). Places in `exclude_places`
    (cool-downs after a capacity error) are skipped."""
    found = []
    for want, where in groups_of(session, spec):
        price = PriceOffer.spot_price if want.use_spot else PriceOffer.ondemand_price
        where = priced(where, want, spot=want.use_spot, ondemand=not want.use_spot)
        k = limit + len(exclude_places)
        while True:  # an excluded place may hold several offers: look further until enough are left
            rows = cheapest(session, where, price, k)
            kept = [p for o in rows if (p := placement_of(o, want, want.use_spot)) is not None
                    and p.place not in exclude_places]
            if len(kept) >= limit or len(rows) < k:
                break
            k *= 2
        found += kept
    found.sort(key=_ranked_key)
    return found[:limit]
