"""Prices: the ranked current offers across the clouds, and one offer's
history. Any token reads them (prices are no team's secret). The prices
are refreshed in the background (broker/background.py)."""
from __future__ import annotations

import logging
from datetime import UTC, date, datetime, time, timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from spotbroker.api.deps import get_caller
from spotbroker.api.errors import Problem, responses
from spotbroker.api.jsonbody import JSONBodyRoute
from spotbroker.broker.jobs.resources import parse_accelerator
from spotbroker.broker.pricing import catalog, store
from spotbroker.broker.pricing.query import MAX_LIMIT, BadCursor, PriceQuery, ranked_prices
from spotbroker.broker.pricing.settings import get_pricing_settings, source_label

log = logging.getLogger("spotbroker.pricing")
MAX_COUNT = 64  # accelerators in one offer


router = APIRouter(prefix="/v1", tags=["prices"], dependencies=[Depends(get_caller, scope="function")],
                   route_class=JSONBodyRoute)


class PriceOut(BaseModel):
    cloud: str
    region: str
    zone: str | None
    zone_id: str | None
    instance_type: str
    accelerator: str | None
    accelerator_count: float
    vcpus: float | None
    memory_gib: float | None
    spot_price: float | None
    on_demand_price: float | None
    saving: float | None          # 1 - spot / on-demand
    observed_at: datetime          # since when this price holds
    checked_at: datetime           # when its source last confirmed it
    age_seconds: float             # since checked_at; a snapshot row: since the snapshot was cut
    source: str
    stale: bool
    age_class: Literal["fresh", "stale", "snapshot"]  # snapshot: the bundled prices, as old as snapshot_date
    snapshot_date: date | None     # the day the bundled snapshot was cut (snapshot rows only)
    risk: float | None             # published interruption frequency, fraction per month
    risk_source: str | None


class PricesOut(BaseModel):
    offers: list[PriceOut]
    next_cursor: str | None


class SampleOut(BaseModel):
    observed_at: datetime
    spot_price: float | None
    on_demand_price: float | None
    source: str


class HistoryOut(BaseModel):
    cloud: str
    zone: str
    instance_type: str
    samples: list[SampleOut]


def _invalid(field: str, message: str) -> Problem:
    return Problem(422, "Invalid request", f"invalid field(s): {field}", errors=[{"field": field, "message": message}])


@router.get("/prices", response_model=PricesOut, responses=responses(401, 422))
async def list_prices(
    request: Request,
    cloud: Annotated[str | None, Query(pattern="^(aws|gcp|azure)$")] = None,
    region: Annotated[str | None, Query(max_length=64)] = None,
    accelerator: Annotated[str | None, Query(max_length=32)] = None,
    count: Annotated[float | None, Query(gt=0, le=MAX_COUNT)] = None,
    spot: bool = True,
    max_price: Annotated[float | None, Query(gt=0)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> PricesOut:
    """Current offers, fresh ones cheapest first (by the spot price, or the
    on-demand one with `spot=false`), then stale ones; `next_cursor` pages on."""
    if accelerator and ":" in accelerator:  # NAME:COUNT, as the CLI and a job spec take it
        accelerator, count = _shape(accelerator, count)
    now = request.app.state.clock.now()
    q = PriceQuery(cloud, region, accelerator, count, spot, max_price, limit, cursor)
    try:
        # One worker-thread hop for the session and the query together (a
        # session dependency and a sync route cost three, and the hops, not
        # the query, were most of a request's time on a busy machine).
        page, next_cursor = await run_in_threadpool(_ranked, request, q, now)
    except BadCursor as exc:
        raise _invalid("cursor", str(exc)) from None
    offers = []
    for p in page:
        o = p.offer
        saving = round(1 - o.spot_price / o.ondemand_price, 4) if o.spot_price and o.ondemand_price else None
        snapshot = catalog.snapshot_date() if o.source == catalog.SOURCE else None
        # Re-reading the bundled file says nothing about the market: a snapshot
        # row is as old as the snapshot, not as the last re-read.
        since = datetime.combine(snapshot, time(), UTC) if snapshot else o.checked_at
        offers.append(PriceOut(
            cloud=o.cloud, region=o.region, zone=o.zone, zone_id=o.zone_id, instance_type=o.instance_type,
            accelerator=o.accelerator, accelerator_count=o.accelerator_count, vcpus=o.vcpus,
            memory_gib=o.memory_gib, spot_price=o.spot_price, on_demand_price=o.ondemand_price, saving=saving,
            observed_at=o.observed_at, checked_at=o.checked_at,
            age_seconds=round((now - since).total_seconds(), 1), source=source_label(o.source), stale=p.stale,
            age_class="snapshot" if o.source == catalog.SOURCE else "stale" if p.stale else "fresh",
            snapshot_date=snapshot,
            risk=o.risk, risk_source=o.risk_source))
    return PricesOut(offers=offers, next_cursor=next_cursor)


def _shape(shape: str, count: float | None) -> tuple[str, float]:
    """`A100:8` -> ("A100", 8); the count was once dropped, answering 1-GPU offers."""
    try:
        name, in_shape = parse_accelerator(shape)
    except ValueError as exc:
        raise _invalid("accelerator", str(exc)) from None
    if in_shape > MAX_COUNT:
        raise _invalid("accelerator", f"{shape!r}: at most {MAX_COUNT} accelerators per offer")
    if count is not None and count != in_shape:
        raise _invalid("count", f"{count:g}, while accelerator says {in_shape:g}: give the count once")
    return name, in_shape


def _ranked(request: Request, q: PriceQuery, now: datetime):
    with request.app.state.session_factory() as session:
        return ranked_prices(session, q, get_pricing_settings(), now)


@router.get("/prices/history", response_model=HistoryOut, responses=responses(
    401, 404, 422, s404="No offer of that instance type there (the answer names the places that have one)"))
async def price_history(
    request: Request,
    cloud: Annotated[str, Query(pattern="^(aws|gcp|azure)$")],
    zone: Annotated[str, Query(min_length=1, max_length=64, description="zone, zone id, or region")],
    instance_type: Annotated[str, Query(min_length=1, max_length=64)],
    region: Annotated[str | None, Query(max_length=64)] = None,
    days: Annotated[float, Query(gt=0, le=3650)] = 90,
) -> HistoryOut:
    """One offer's price samples, oldest first (one each time a price changed)."""
    since = request.app.state.clock.now() - timedelta(days=days)

    def read() -> tuple[list[store.Sample] | None, list[str]]:
        with request.app.state.session_factory() as session:
            rows = store.history(session, cloud, zone, instance_type, region=region, since=since)
            return rows, [] if rows is not None else store.places_of(session, cloud, instance_type)

    rows, places = await run_in_threadpool(read)
    if rows is None:  # (an empty answer read as "the price never changed")
        where = f"; it has one in: {', '.join(places)}" if places else "; it has none anywhere"
        raise Problem(404, "Not found", f"{cloud} has no offer of {instance_type} in {zone}"
                      f"{f' ({region})' if region else ''}{where}")
    return HistoryOut(cloud=cloud, zone=zone, instance_type=instance_type, samples=[
        SampleOut(observed_at=r.observed_at, spot_price=r.spot_price, on_demand_price=r.ondemand_price,
                  source=source_label(r.source)) for r in rows])
