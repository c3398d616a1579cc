"""What an attempt costs, as ledger entries.

Cost = the integral of the attempt's price over its running time × nodes.
The price is the one stored at launch (`attempts.price_per_hour`), except
for a spot attempt where the price history (`offers`, one sample per
change, see broker/pricing/store.py) records a change of the spot price in
its place after launch: from that moment the new price is in force (AWS
bills spot at the current price). On-demand attempts keep their launch
price.

Wasted cost = the run since the job's last committed checkpoint, at a
reclaim (preemption or vanished node), at the price in force then: the work
the next attempt does again. Savings = what the same node-hours would have
cost on demand − what was paid.

This module computes; `accrual.py` writes (append-only) and `views.py`
reads. The not-yet-written tail of an open attempt (`pending`) is what the
next accrual will write, so a reader adds it and sees exactly to now.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from spotbroker.broker.jobs.states import RECLAIMED
from spotbroker.broker.store.models import Attempt, Checkpoint, Offer, PriceOffer

USAGE, WASTE, CORRECTION = "usage", "waste", "correction"
_RECLAIMED = frozenset(str(r) for r in RECLAIMED)


@dataclass(frozen=True)
class Segment:
    start: datetime
    end: datetime
    price: float  # per node-hour


@dataclass(frozen=True)
class Draft:
    """A ledger entry before it is written (or the tail, never written)."""

    kind: str
    start_at: datetime
    end_at: datetime
    node_hours: float
    price_per_hour: float
    amount: float
    ondemand_amount: float
    wasted: float


def place(attempt: Attempt) -> str | None:
    return attempt.zone or attempt.zone_id


def _same_place(attempt: Attempt) -> list:
    """The history samples of the attempt's place, by the history index's key."""
    match = [Offer.cloud == attempt.cloud, Offer.instance_type == attempt.instance_type,
             Offer.region == attempt.region, Offer.spot_price.is_not(None)]
    if attempt.zone_id is not None:
        match.append(Offer.zone_id == attempt.zone_id)
    elif attempt.zone is not None:
        match.append(Offer.zone == attempt.zone)
    else:
        match += [Offer.zone.is_(None), Offer.zone_id.is_(None)]
    return match


def segments(session: Session, attempt: Attempt, start: datetime, end: datetime) -> list[Segment]:
    """[start, end) cut where the price in force changes, each with its price."""
    if end <= start:
        return []
    if not attempt.use_spot or attempt.instance_type is None or attempt.started_at is None:
        return [Segment(start, end, attempt.price_per_hour)]
    match = _same_place(attempt)
    # The price in force at `start`: the newest change after launch and not after start, else launch's.
    before = session.scalar(select(Offer.spot_price).where(
        *match, Offer.observed_at > attempt.started_at, Offer.observed_at <= start)
        .order_by(Offer.observed_at.desc(), Offer.id.desc()).limit(1))
    changes = session.execute(select(Offer.observed_at, Offer.spot_price).where(
        *match, Offer.observed_at > max(start, attempt.started_at), Offer.observed_at < end)
        .order_by(Offer.observed_at, Offer.id)).all()
    out, at, price = [], start, attempt.price_per_hour if before is None else before
    for when, new in changes:
        if when > at:
            out.append(Segment(at, when, price))
            at = when
        price = new
    out.append(Segment(at, end, price))
    return out


def ondemand_price(session: Session, attempt: Attempt) -> float:
    """Per node-hour, for savings: the attempt's own price when it ran on
    demand; else its place's current on-demand price, else (unknown) the
    price paid, so that no saving is claimed that cannot be shown."""
    if not attempt.use_spot or attempt.instance_type is None:
        return attempt.price_per_hour
    found = session.scalar(select(PriceOffer.ondemand_price).where(
        PriceOffer.cloud == attempt.cloud, PriceOffer.region == (attempt.region or ""),
        PriceOffer.place == (attempt.zone_id or attempt.zone or ""),
        PriceOffer.instance_type == attempt.instance_type))
    if found is None:  # the shape's on-demand price anywhere in the region
        found = session.scalar(select(func.min(PriceOffer.ondemand_price)).where(
            PriceOffer.cloud == attempt.cloud, PriceOffer.region == (attempt.region or ""),
            PriceOffer.instance_type == attempt.instance_type))
    return found if found is not None else attempt.price_per_hour


def edge(at: datetime, step_s: float) -> datetime:
    """The last multiple of `step_s` since the epoch at or before `at`."""
    return datetime.fromtimestamp(at.timestamp() // step_s * step_s, tz=at.tzinfo)


def _grid(start: datetime, end: datetime, step_s: float | None) -> list[tuple[datetime, datetime]]:
    """[start, end) cut at multiples of `step_s` since the epoch (whole
    minutes, whole days stay whole)."""
    if not step_s:
        return [(start, end)]
    out, at = [], start
    while at < end:
        edge = datetime.fromtimestamp((at.timestamp() // step_s + 1) * step_s, tz=at.tzinfo)
        out.append((at, min(edge, end)))
        at = min(edge, end)
    return out


def usage(session: Session, attempt: Attempt, start: datetime, end: datetime, od_price: float | None = None,
          step_s: float | None = None) -> list[Draft]:
    """The usage entries of [start, end): one per price in force, each cut
    into pieces of at most `step_s` seconds (so a burn window counts them
    to within one piece, however long a catch-up after downtime is)."""
    od = ondemand_price(session, attempt) if od_price is None else od_price
    out = []
    for s in segments(session, attempt, start, end):
        for a, b in _grid(s.start, s.end, step_s):
            node_hours = attempt.num_nodes * (b - a).total_seconds() / 3600
            out.append(Draft(USAGE, a, b, node_hours, s.price, s.price * node_hours,
                             max(od, s.price) * node_hours, 0.0))
    return out


def lost_since(session: Session, attempt: Attempt) -> datetime | None:
    """Where the lost work starts for a reclaimed attempt (the job's newest
    checkpoint committed before the end, or the attempt's start); None when
    nothing was lost (not a reclaim, or never started)."""
    if attempt.started_at is None or attempt.ended_at is None:
        return None
    if attempt.end_reason not in _RECLAIMED:
        return None
    newest = session.scalar(select(func.max(Checkpoint.committed_at)).where(
        Checkpoint.job_id == attempt.job_id, Checkpoint.committed_at <= attempt.ended_at))
    return max(attempt.started_at, newest) if newest is not None else attempt.started_at


def waste(session: Session, attempt: Attempt) -> Draft | None:
    """The waste entry of a reclaimed attempt (amount 0: it was paid in usage)."""
    since = lost_since(session, attempt)
    if since is None or since >= attempt.ended_at:
        return None
    parts = segments(session, attempt, since, attempt.ended_at)
    node_hours = attempt.num_nodes * (attempt.ended_at - since).total_seconds() / 3600
    lost = sum(p.price * attempt.num_nodes * (p.end - p.start).total_seconds() / 3600 for p in parts)
    return Draft(WASTE, since, attempt.ended_at, node_hours, parts[-1].price, 0.0, 0.0, lost)


def pending(session: Session, attempt: Attempt, accrued_to: datetime | None, now: datetime,
            step_s: float | None = None) -> tuple[list[Draft], datetime | None, bool]:
    """What the next accrual writes for the attempt, from `accrued_to` (None:
    nothing written yet): (entries, how far it then reaches, whether that
    closes the attempt). Usage to now, or to its end; once ended, its waste.
    An attempt found to have ended before what was already written (its end
    committed while a pass accrued it as running) gets a correction: the
    overcharge, negated."""
    if attempt.started_at is None:
        return [], None, False
    end = min(attempt.ended_at, now) if attempt.ended_at is not None else now
    start = accrued_to or attempt.started_at
    closing = attempt.ended_at is not None and attempt.ended_at <= now
    if end >= start:
        drafts = usage(session, attempt, start, end, step_s=step_s)
    else:
        drafts = [Draft(CORRECTION, d.start_at, d.end_at, -d.node_hours, d.price_per_hour, -d.amount,
                        -d.ondemand_amount, 0.0) for d in usage(session, attempt, end, start, step_s=step_s)]
    if closing:
        lost = waste(session, attempt)
        if lost is not None:
            drafts.append(lost)
    return drafts, end, closing
