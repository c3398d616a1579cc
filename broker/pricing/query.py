"""The ranked price list (`GET /v1/prices`, `spotbroker prices`): current,
listed offers, fresh ones cheapest first, then the stale ones cheapest
first, in pages with a cursor.

Fresh and stale are two index-ordered scans rather than one sort over a
computed column, so a page costs the same with 50 offers or 50,000; rows
are read as plain rows of the columns the answer shows, not ORM objects
(a page of 1,000 costs a fifth as much).
"""
from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, or_, select
from sqlalchemy.engine import Row
from sqlalchemy.orm import Session

from spotbroker.broker.pricing.normalise import asked_accelerator
from spotbroker.broker.pricing.settings import KNOWN_SOURCES, PricingSettings
from spotbroker.broker.store.models import PriceOffer

MAX_LIMIT = 1000
MAX_OFFER_ID = 2**63 - 1


class BadCursor(ValueError):
    pass


@dataclass(frozen=True)
class PriceQuery:
    cloud: str | None = None
    region: str | None = None
    accelerator: str | None = None
    count: float | None = None
    spot: bool = True
    max_price: float | None = None
    limit: int = 50
    cursor: str | None = None


# What an answer shows of an offer (and what the cursor needs).
COLUMNS = (PriceOffer.id, PriceOffer.cloud, PriceOffer.region, PriceOffer.zone, PriceOffer.zone_id,
           PriceOffer.instance_type, PriceOffer.accelerator, PriceOffer.accelerator_count, PriceOffer.vcpus,
           PriceOffer.memory_gib, PriceOffer.spot_price, PriceOffer.ondemand_price, PriceOffer.observed_at,
           PriceOffer.checked_at, PriceOffer.source, PriceOffer.risk, PriceOffer.risk_source)


@dataclass(frozen=True)
class PricedOffer:
    offer: Row  # of COLUMNS, read by attribute like a PriceOffer
    stale: bool


def encode_cursor(stale: bool, price: float, offer_id: int) -> str:
    raw = json.dumps([int(stale), price, offer_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[bool, float, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        stale, price, offer_id = json.loads(raw)
        stale, price, offer_id = bool(stale), float(price), int(offer_id)
    except (ValueError, TypeError, OverflowError) as exc:  # (int(inf), float(10**400))
        raise BadCursor("not a cursor this API gave out; start again without it") from exc
    if not (math.isfinite(price) and 0 <= offer_id <= MAX_OFFER_ID):  # ids are BIGINT: a larger one is a 500 there
        raise BadCursor("not a cursor this API gave out; start again without it")
    return stale, price, offer_id


def fresh_condition(settings: PricingSettings, now: datetime):
    """True for an offer its source confirmed recently enough."""
    known = [and_(PriceOffer.source == s, PriceOffer.checked_at >= now - timedelta(seconds=settings.stale_after(s)))
             for s in KNOWN_SOURCES]
    other = and_(PriceOffer.source.not_in(KNOWN_SOURCES),
                 PriceOffer.checked_at >= now - timedelta(seconds=settings.stale_after("catalog")))
    return or_(*known, other)


def _filters(q: PriceQuery, price):
    where = [PriceOffer.listed.is_(True), price.is_not(None)]
    if q.cloud:
        where.append(PriceOffer.cloud == q.cloud.lower())
    if q.region:
        where.append(PriceOffer.region == q.region)
    if q.accelerator:
        # Names are stored normalised, so an exact match can use the shape index.
        where.append(PriceOffer.accelerator == asked_accelerator(q.accelerator))
    if q.count is not None:
        where.append(PriceOffer.accelerator_count == q.count)
    if q.max_price is not None:
        where.append(price <= q.max_price)
    return where


def ranked_prices(session: Session, q: PriceQuery, settings: PricingSettings,
                  now: datetime) -> tuple[list[PricedOffer], str | None]:
    """One page of offers and the cursor of the next (None on the last)."""
    price = PriceOffer.spot_price if q.spot else PriceOffer.ondemand_price
    after = decode_cursor(q.cursor) if q.cursor else None
    fresh = fresh_condition(settings, now)
    found: list[PricedOffer] = []
    for stale in (False, True):
        if after is not None and after[0] and not stale:
            continue  # the cursor is already among the stale ones
        where = [*_filters(q, price), ~fresh if stale else fresh]
        if after is not None and after[0] == stale:
            where.append(or_(price > after[1], and_(price == after[1], PriceOffer.id > after[2])))
        want = q.limit + 1 - len(found)
        rows = session.execute(select(*COLUMNS).where(*where).order_by(price, PriceOffer.id).limit(want)).all()
        found.extend(PricedOffer(o, stale) for o in rows)
        if len(found) > q.limit:
            break
    page, more = found[:q.limit], len(found) > q.limit
    if not more or not page:
        return page, None
    last = page[-1]
    return page, encode_cursor(last.stale, last.offer.spot_price if q.spot else last.offer.ondemand_price,
                               last.offer.id)


def is_fresh(offer: PriceOffer | Row, settings: PricingSettings, now: datetime) -> bool:
    return offer.checked_at >= now - timedelta(seconds=settings.stale_after(offer.source))

