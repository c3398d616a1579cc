"""What an attempt costs, as ledger entries.

Cost = the integral of the attempt's price over its running time × nodes.
The price is the one stored at launch (`attempts.price_per_hour`), except
for a spot attempt where the price history (`offers`, one sample per
change, see broker/pricing/store.py) records a change of the spot price in
its place after launch: from that moment the new price is in force (AWS
bills spot at the current price). On-demand attempts keep their launch
price.

Energy (kWh) and emissions (kg CO2e) ride on the same entries: node-hours
× the attempt's power at the wall × its grid's intensity, both fixed at
launch (broker/energy/), so every view of them adds up as dollars do.

Wasted cost = the run since the job's last committed checkpoint, at a
reclaim (preemption or vanished node), at the price in force then: the work
the next attempt does again. Savings = what the same node-hours would have
cost on demand − what was paid.

This module computes; `accrual.py` writes (append-only) and `views.py`
reads. The not-yet-written tail of an open attempt (`pending`) is what the
next accrual will write, so a reader adds it and sees exactly to now. The
prices the arithmetic needs are read first, for any number of attempts at
once (`Prices.load`, at most three statements), so a reader adding every
running attempt's tail (`pending_all`) pays no statement per attempt.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, func, literal, or_, select, tuple_
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
    kwh: float = 0.0
    co2e_kg: float = 0.0


def place(attempt: Attempt) -> str | None:
    return attempt.zone or attempt.zone_id


def _place_key(attempt: Attempt) -> tuple:
    """Which history samples are the attempt's place's: by zone id, else by
    zone, else region-wide (neither)."""
    if attempt.zone_id is not None:
        return attempt.cloud, attempt.instance_type, attempt.region, "zone_id", attempt.zone_id
    if attempt.zone is not None:
        return attempt.cloud, attempt.instance_type, attempt.region, "zone", attempt.zone
    return attempt.cloud, attempt.instance_type, attempt.region, None, None


def _same_place(key: tuple) -> list:
    """The history samples of a place, by the history index's key."""
    cloud, instance_type, region, by, value = key
    match = [Offer.cloud == cloud, Offer.instance_type == instance_type, Offer.region == region,
             Offer.spot_price.is_not(None)]
    if by == "zone_id":
        match.append(Offer.zone_id == value)
    elif by == "zone":
        match.append(Offer.zone == value)
    else:
        match += [Offer.zone.is_(None), Offer.zone_id.is_(None)]
    return match


def _priced_by_history(attempt: Attempt) -> bool:
    return attempt.use_spot and attempt.instance_type is not None and attempt.started_at is not None


def _span(attempt: Attempt, accrued_to: datetime | None, now: datetime) -> tuple[datetime, datetime, bool]:
    """(from where the next accrual writes, to where, whether that closes the attempt)."""
    end = min(attempt.ended_at, now) if attempt.ended_at is not None else now
    closing = attempt.ended_at is not None and attempt.ended_at <= now
    return accrued_to or attempt.started_at, end, closing


class Prices:
    """What a set of attempts' entries depend on besides the attempts
    themselves: the spot price changes of each spot attempt's place over
    the span its entries cover, each shape's on-demand price, and for an
    attempt the cloud reclaimed, its job's newest checkpoint before the end.
    `load` reads them for any number of attempts in at most three
    statements, so adding a hundred running attempts' unwritten tails costs
    no statement per attempt; the arithmetic below reads only from here."""

    def __init__(self, history: dict[tuple, list[tuple[datetime, int, float]]],
                 ondemand: dict[tuple, dict[str, float | None]], checkpoints: dict[int, datetime]) -> None:
        self.history = history          # place -> (observed_at, id, spot price), in that order
        self.ondemand = ondemand        # (cloud, region, instance type) -> place -> on-demand price
        self.checkpoints = checkpoints  # reclaimed attempt id -> its job's newest checkpoint before its end

    @classmethod
    def load(cls, session: Session, attempts: Sequence[tuple[Attempt, datetime | None]], now: datetime) -> Prices:
        """Everything `pending(attempt, accrued_to, now)` needs, for each of `attempts`."""
        started = [(a, accrued_to) for a, accrued_to in attempts if a.started_at is not None]
        reclaimed = [a.id for a, accrued_to in started if _span(a, accrued_to, now)[2] and a.end_reason in _RECLAIMED]
        prices = cls({}, {}, _newest_checkpoints(session, reclaimed))
        # Per place, the earliest instant whose price in force is wanted, and the latest end.
        spans: dict[tuple, tuple[datetime, datetime]] = {}
        for a, accrued_to in started:
            if not _priced_by_history(a):
                continue
            start, end, _ = _span(a, accrued_to, now)
            lo, hi = min(start, end, prices.lost_since(a) or start), max(start, end)
            known = spans.get(_place_key(a), (lo, hi))
            spans[_place_key(a)] = min(known[0], lo), max(known[1], hi)
        prices.history = _history(session, spans)
        prices.ondemand = _ondemand(session, {(a.cloud, a.region or "", a.instance_type)
                                              for a, _ in started if _priced_by_history(a)})
        return prices

    # --- the arithmetic ------------------------------------------------------------------

    def segments(self, attempt: Attempt, start: datetime, end: datetime) -> list[Segment]:
        """[start, end) cut where the price in force changes, each with its price."""
        if end <= start:
            return []
        if not _priced_by_history(attempt):
            return [Segment(start, end, attempt.price_per_hour)]
        out, at, price = [], start, attempt.price_per_hour
        for when, _, new in self.history.get(_place_key(attempt), ()):
            if when <= attempt.started_at:   # before launch: the launch price rules
                continue
            if when >= end:
                break
            if when > at:
                out.append(Segment(at, when, price))
                at = when
            price = new                      # at or before `start`: the price in force then
        out.append(Segment(at, end, price))
        return out

    def ondemand_price(self, attempt: Attempt) -> float:
        """Per node-hour, for savings: the attempt's own price when it ran on
        demand; else its place's current on-demand price, else the shape's
        cheapest in the region, else (unknown) the price paid, so that no
        saving is claimed that cannot be shown."""
        if not attempt.use_spot or attempt.instance_type is None:
            return attempt.price_per_hour
        places = self.ondemand.get((attempt.cloud, attempt.region or "", attempt.instance_type), {})
        found = places.get(attempt.zone_id or attempt.zone or "")
        if found is None:
            found = min((p for p in places.values() if p is not None), default=None)
        return found if found is not None else attempt.price_per_hour

    def lost_since(self, attempt: Attempt) -> datetime | None:
        """Where the lost work starts for a reclaimed attempt (the job's newest
        checkpoint committed before the end, or the attempt's start); None when
        nothing was lost (not a reclaim, or never started)."""
        if attempt.started_at is None or attempt.ended_at is None or attempt.end_reason not in _RECLAIMED:
            return None
        newest = self.checkpoints.get(attempt.id)
        return max(attempt.started_at, newest) if newest is not None else attempt.started_at

    def usage(self, attempt: Attempt, start: datetime, end: datetime, step_s: float | None = None) -> list[Draft]:
        """The usage entries of [start, end): one per price in force, each cut
        into pieces of at most `step_s` seconds (so a burn window counts them
        to within one piece, however long a catch-up after downtime is)."""
        od = self.ondemand_price(attempt)
        out = []
        for s in self.segments(attempt, start, end):
            for a, b in _grid(s.start, s.end, step_s):
                node_hours = attempt.num_nodes * (b - a).total_seconds() / 3600
                kwh = node_hours * (attempt.power_kw or 0.0)
                co2e_kg = kwh * (attempt.grid_g_per_kwh or 0.0) / 1000
                out.append(Draft(USAGE, a, b, node_hours, s.price, s.price * node_hours,
                                 max(od, s.price) * node_hours, 0.0, kwh, co2e_kg))
        return out

    def waste(self, attempt: Attempt) -> Draft | None:
        """The waste entry of a reclaimed attempt (amount 0: it was paid in usage)."""
        since = self.lost_since(attempt)
        if since is None or since >= attempt.ended_at:
            return None
        parts = self.segments(attempt, since, attempt.ended_at)
        node_hours = attempt.num_nodes * (attempt.ended_at - since).total_seconds() / 3600
        lost = sum(p.price * attempt.num_nodes * (p.end - p.start).total_seconds() / 3600 for p in parts)
        return Draft(WASTE, since, attempt.ended_at, node_hours, parts[-1].price, 0.0, 0.0, lost)

    def pending(self, attempt: Attempt, accrued_to: datetime | None, now: datetime,
                step_s: float | None = None) -> tuple[list[Draft], datetime | None, bool]:
        """See `pending` (the module's); `load` must have been given the attempt."""
        if attempt.started_at is None:
            return [], None, False
        start, end, closing = _span(attempt, accrued_to, now)
        if end >= start:
            drafts = self.usage(attempt, start, end, step_s)
        else:
            drafts = [Draft(CORRECTION, d.start_at, d.end_at, -d.node_hours, d.price_per_hour, -d.amount,
                            -d.ondemand_amount, 0.0, -d.kwh, -d.co2e_kg)
                      for d in self.usage(attempt, end, start, step_s)]
        if closing:
            lost = self.waste(attempt)
            if lost is not None:
                drafts.append(lost)
        return drafts, end, closing


def _newest_checkpoints(session: Session, attempt_ids: list[int]) -> dict[int, datetime]:
    """Reclaimed attempt id -> its job's newest checkpoint committed before its end."""
    if not attempt_ids:
        return {}
    return {i: at for i, at in session.execute(
        select(Attempt.id, func.max(Checkpoint.committed_at))
        .join(Checkpoint, and_(Checkpoint.job_id == Attempt.job_id, Checkpoint.committed_at <= Attempt.ended_at))
        .where(Attempt.id.in_(attempt_ids)).group_by(Attempt.id)) if at is not None}


def _history(session: Session, spans: dict[tuple, tuple[datetime, datetime]]) -> dict[tuple, list]:
    """Each place's samples from the newest one at or before its span's
    start (the price in force then) to its span's end: the changes in
    between are all the arithmetic needs. One statement for every place."""
    if not spans:
        return {}
    when = [and_(*_same_place(key), Offer.observed_at < hi, Offer.observed_at >= func.coalesce(
                select(func.max(Offer.observed_at)).where(*_same_place(key), Offer.observed_at <= lo)
                .scalar_subquery(), literal(lo, Offer.observed_at.type)))
            for key, (lo, hi) in spans.items()]
    out: dict[tuple, list] = {}
    for row in session.execute(select(Offer.cloud, Offer.instance_type, Offer.region, Offer.zone, Offer.zone_id,
                                      Offer.observed_at, Offer.id, Offer.spot_price)
                               .where(or_(*when)).order_by(Offer.observed_at, Offer.id)):
        for key in _keys_of(row):
            if key in spans:
                out.setdefault(key, []).append((row.observed_at, row.id, row.spot_price))
    return out


def _keys_of(sample) -> list[tuple]:
    """The place keys a history sample counts for (see _place_key)."""
    base = (sample.cloud, sample.instance_type, sample.region)
    if sample.zone_id is None and sample.zone is None:
        return [(*base, None, None)]
    return [(*base, by, value) for by, value in (("zone_id", sample.zone_id), ("zone", sample.zone))
            if value is not None]


def _ondemand(session: Session, shapes: set[tuple[str, str, str]]) -> dict[tuple, dict[str, float | None]]:
    """(cloud, region, instance type) -> place -> its current on-demand price."""
    out: dict[tuple, dict[str, float | None]] = {}
    if shapes:
        for cloud, region, instance_type, where, price in session.execute(
                select(PriceOffer.cloud, PriceOffer.region, PriceOffer.instance_type, PriceOffer.place,
                       PriceOffer.ondemand_price)
                .where(tuple_(PriceOffer.cloud, PriceOffer.region, PriceOffer.instance_type).in_(shapes))):
            out.setdefault((cloud, region, instance_type), {})[where] = price
    return out


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


def pending(session: Session, attempt: Attempt, accrued_to: datetime | None, now: datetime,
            step_s: float | None = None) -> tuple[list[Draft], datetime | None, bool]:
    """What the next accrual writes for the attempt, from `accrued_to` (None:
    nothing written yet): (entries, how far it then reaches, whether that
    closes the attempt). Usage to now, or to its end; once ended, its waste.
    An attempt found to have ended before what was already written (its end
    committed while a pass accrued it as running) gets a correction: the
    overcharge, negated."""
    return pending_all(session, [(attempt, accrued_to)], now, step_s)[0]


def pending_all(session: Session, attempts: Sequence[tuple[Attempt, datetime | None]], now: datetime,
                step_s: float | None = None) -> list[tuple[list[Draft], datetime | None, bool]]:
    """`pending` for each (attempt, accrued_to), their prices read at once."""
    prices = Prices.load(session, attempts, now)
    return [prices.pending(a, accrued_to, now, step_s) for a, accrued_to in attempts]
