"""Where refreshed prices land: one current row per offer (`price_offers`)
and a history sample (`offers`) written only when a price changes.

A refresh is applied whole, in one transaction, or not at all: a source
that fails half-way never leaves a half-updated set (its old prices stay
and turn stale in time). A source is the authority for the clouds and
regions it covered: an offer there that it no longer lists is unlisted, and
nothing is placed on it. The bundled catalog never overrides a live source.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import and_, bindparam, delete, exists, func, or_, select, update
from sqlalchemy.orm import Session, aliased

from spotbroker.broker.pricing.catalog import SOURCE as CATALOG
from spotbroker.broker.pricing.catalog import OfferRow
from spotbroker.broker.pricing.normalise import QualityReport, clean
from spotbroker.broker.store.models import Offer, PriceOffer

Key = tuple[str, str, str, str]  # cloud, region, place, instance type
# cloud -> the regions a refresh covered (None: every region of that cloud)
Scope = dict[str, frozenset[str] | None]
_SPEC = ("zone", "zone_id", "accelerator", "accelerator_count", "vcpus", "memory_gib")
# Whose offer a source may replace or unlist: never one of a source ranked
# above it. The snapshot is the weakest; `aws-public` (list prices, spot
# estimated region-wide) comes next; a cloud's own live API is the authority.
_RANK = {CATALOG: 0, "aws-public": 1}
_LIVE = 2


def _rank(source: str) -> int:
    return _RANK.get(source, _LIVE)


def place_of(zone: str | None, zone_id: str | None) -> str:
    """The offer's place in its key: the zone id where there is one (AWS
    zone names differ per account; ids do not), else the zone name."""
    return zone_id or zone or ""


def key_of(row: OfferRow) -> Key:
    return row.cloud, row.region, place_of(row.zone, row.zone_id), row.instance_type


@dataclass
class RefreshResult:
    """What one refresh changed (printed by `spotbroker prices --refresh`)."""

    source: str
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    unlisted: int = 0
    kept_live: int = 0          # rows left alone: a source ranked above this one owns them
    samples: int = 0
    risks: int = 0              # offers given a published risk by a risk feed
    changes: list[str] = field(default_factory=list)
    quality: QualityReport = field(default_factory=QualityReport)

    def summary(self) -> str:
        risks = f"; {self.risks} offers given a published risk" if self.risks else ""
        return (f"{self.source}: {self.new} new, {self.changed} changed, {self.unchanged} unchanged, "
                f"{self.unlisted} no longer listed; {self.samples} history samples{risks}; dropped or fixed: "
                f"{self.quality}")


def _same(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and round(a, 6) == round(b, 6))


def _in_scope(cloud: str, region: str, scope: Scope) -> bool:
    return cloud in scope and (scope[cloud] is None or region in scope[cloud])


def _describe(row: OfferRow, old: tuple[float | None, float | None] | None) -> str:
    where = f"{row.cloud}/{row.region}/{place_of(row.zone, row.zone_id) or '*'} {row.instance_type}"
    now = f"spot {row.spot_price} on-demand {row.ondemand_price}"
    return f"{where}: {now}" if old is None else f"{where}: spot {old[0]} -> {row.spot_price}, " \
                                                 f"on-demand {old[1]} -> {row.ondemand_price}"


def apply_refresh(session: Session, source: str, rows: Iterable[OfferRow], now: datetime, scope: Scope,
                  *, report: QualityReport | None = None, keep_changes: int = 50) -> RefreshResult:
    """Write one source's complete answer for `scope`; rows pass the
    data-quality rules (`normalise.clean`) first."""
    result = RefreshResult(source, quality=report or QualityReport())
    fresh: dict[Key, OfferRow] = {}
    for raw in rows:
        row = clean(raw, result.quality)
        if row is not None:
            fresh[key_of(row)] = row
    existing = {(o.cloud, o.region, o.place, o.instance_type): o for o in session.execute(
        select(PriceOffer.id, PriceOffer.cloud, PriceOffer.region, PriceOffer.place, PriceOffer.instance_type,
               PriceOffer.spot_price, PriceOffer.ondemand_price, PriceOffer.source, PriceOffer.listed)
        .where(PriceOffer.cloud.in_(list(scope))))}
    inserts, updates, samples = [], [], []
    for key, row in fresh.items():
        old = existing.get(key)
        if old is not None and _rank(source) < _rank(old.source):
            result.kept_live += 1
            continue
        values = {"cloud": row.cloud, "region": row.region, "instance_type": row.instance_type,
                  "spot_price": row.spot_price, "ondemand_price": row.ondemand_price, "source": source,
                  **{name: getattr(row, name) for name in _SPEC}}
        # The snapshot carries no risk: it must not wipe what a risk feed set.
        risk = {} if source == CATALOG and old is not None else {"risk": row.risk, "risk_source": row.risk_source}
        if old is None:
            inserts.append({**values, **risk, "place": key[2], "observed_at": now, "checked_at": now,
                            "listed": True})
            result.new += 1
        elif _same(old.spot_price, row.spot_price) and _same(old.ondemand_price, row.ondemand_price) \
                and old.listed:
            updates.append({"id": old.id, **values, **risk, "checked_at": now})
            result.unchanged += 1
            continue
        else:
            updates.append({"id": old.id, **values, **risk, "observed_at": now, "checked_at": now,
                            "listed": True})
            result.changed += 1
        samples.append({**values, "observed_at": now})
        if len(result.changes) < keep_changes:
            result.changes.append(_describe(row, None if old is None else (old.spot_price, old.ondemand_price)))
    for key, old in existing.items():
        gone = key not in fresh and old.listed and _in_scope(old.cloud, old.region, scope)
        if gone and (old.source == source or _rank(old.source) < _rank(source)):
            # Owned by this source from now on, so the catalog cannot list it again.
            updates.append({"id": old.id, "listed": False, "source": source})
            result.unlisted += 1
            if len(result.changes) < keep_changes:
                result.changes.append(f"{'/'.join(k for k in key[:3] if k)} {key[3]}: no longer listed")
    # New offers and samples as plain executemany inserts: the ORM's bulk path
    # costs twice as much, and a fresh database's seed is thousands of rows.
    session.flush()
    if inserts:
        session.connection().execute(PriceOffer.__table__.insert(), inserts)
    if updates:
        session.execute(update(PriceOffer), updates)
    if samples:
        session.connection().execute(Offer.__table__.insert(), samples)
    result.samples = len(samples)
    return result


def apply_risks(session: Session, risks: dict[tuple[str, str, str], tuple[float, str]]) -> int:
    """Set the published risk of the offers of each (cloud, region, instance
    type), except where a live price source set its own (AWS's combines the
    advisor's band with placement scores per zone); the offers updated."""
    if not risks:
        return 0
    t = PriceOffer.__table__
    feeds = sorted({name for _, name in risks.values()})
    stmt = t.update().where(t.c.cloud == bindparam("c"), t.c.region == bindparam("r"),
                            t.c.instance_type == bindparam("i"),
                            or_(t.c.risk_source.is_(None), *(t.c.risk_source == f for f in feeds))) \
        .values(risk=bindparam("v"), risk_source=bindparam("s"))
    done = session.connection().execute(stmt, [{"c": c, "r": r, "i": i, "v": v, "s": s}
                                               for (c, r, i), (v, s) in risks.items()])
    return done.rowcount or 0


def prune_history(session: Session, now: datetime, retention_days: float) -> int:
    """Drop samples older than the retention, except each offer's newest
    (it is the price still in force)."""
    newer = aliased(Offer)
    cutoff = now - timedelta(days=retention_days)
    same_key = and_(newer.cloud == Offer.cloud, newer.region == Offer.region,
                    newer.instance_type == Offer.instance_type,
                    func.coalesce(newer.zone, newer.zone_id, "") == func.coalesce(Offer.zone, Offer.zone_id, ""),
                    newer.observed_at > Offer.observed_at)
    gone = session.execute(delete(Offer).where(Offer.observed_at < cutoff, exists().where(same_key)))
    return gone.rowcount or 0


@dataclass(frozen=True)
class Sample:
    observed_at: datetime
    spot_price: float | None
    ondemand_price: float | None
    source: str


def places_of(session: Session, cloud: str, instance_type: str, limit: int = 20) -> list[str]:
    """Where the cloud offers the instance type, as `zone` may name them
    (the zone's name where known, else its id; a region-wide offer's region)."""
    rows = session.execute(select(PriceOffer.zone, PriceOffer.zone_id, PriceOffer.region).distinct().where(
        PriceOffer.cloud == cloud, PriceOffer.instance_type == instance_type).limit(limit))
    return sorted({zone or zone_id or region for zone, zone_id, region in rows})


def _find(session: Session, cloud: str, zone: str, instance_type: str, region: str | None):
    """The offer `zone` names: by its key's place (a zone id or zone), else
    by zone name, else as a region-wide offer; each step an indexed look-up."""
    base = select(PriceOffer.region, PriceOffer.zone, PriceOffer.zone_id).where(
        PriceOffer.cloud == cloud, PriceOffer.instance_type == instance_type,
        *([PriceOffer.region == region] if region is not None else []))
    for cond in (PriceOffer.place == zone, PriceOffer.zone == zone,
                 (PriceOffer.place == "") & (PriceOffer.region == zone)):
        found = session.execute(base.where(cond).limit(1)).first()
        if found is not None:
            return found
    return None


def history(session: Session, cloud: str, zone: str, instance_type: str, *, region: str | None = None,
            since: datetime | None = None, limit: int = 10_000) -> list[Sample] | None:
    """One offer's samples, oldest first (None: no such offer); `zone` is a
    zone name, a zone id, or the region for region-wide offers (Azure). The
    offer is found first, so the samples are read by the history index's
    exact key."""
    offer = _find(session, cloud, zone, instance_type, region)
    if offer is None:
        return None
    match = [Offer.cloud == cloud, Offer.instance_type == instance_type, Offer.region == offer.region]
    if offer.zone_id is not None:  # the key (samples from the snapshot have no zone name)
        match.append(Offer.zone_id == offer.zone_id)
    else:
        match += [Offer.zone_id.is_(None), Offer.zone == offer.zone if offer.zone else Offer.zone.is_(None)]
    if since is not None:
        match.append(Offer.observed_at >= since)
    rows = session.execute(select(Offer.observed_at, Offer.spot_price, Offer.ondemand_price, Offer.source)
                           .where(*match).order_by(Offer.observed_at, Offer.id).limit(limit))
    return [Sample(*r) for r in rows]
