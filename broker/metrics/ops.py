"""The deployment's health as /metrics shows it (read from the shared
database, with the team totals of broker/metrics/collector.py, by the one broker
that holds the metrics lease):

- the reconciler's lag: how long the job that has waited longest for a
  decision has waited past its due time (`jobs.next_check_at`), among live
  jobs no broker holds a lease on. Passes run every
  SPOTBROKER_RECONCILE_INTERVAL seconds, so a healthy deployment stays below
  a few of them; a lag that grows means no broker is reconciling (or they
  cannot keep up). Jobs waiting for a free local slot count too.
- each price source's freshness: when its last refresh succeeded
  (`price_source_leases.last_ok_at`; 0 when it never did), how old that is,
  and whether its last refresh failed. Every configured source has a series.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime

from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from spotbroker.broker.jobs.states import LIVE_JOB_STATES
from spotbroker.broker.pricing.settings import PricingSettings
from spotbroker.broker.store.models import Job, PriceSourceLease


def _utc(at: datetime) -> datetime:
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def reconciler_lag(session: Session, now: datetime) -> Metric:
    oldest = session.scalar(select(func.min(Job.next_check_at)).where(
        Job.state.in_([str(s) for s in LIVE_JOB_STATES]), Job.next_check_at <= now,
        or_(Job.lease_expires_at.is_(None), Job.lease_expires_at < now)))
    lag = max(0.0, (now - _utc(oldest)).total_seconds()) if oldest is not None else 0.0
    return GaugeMetricFamily("spotbroker_reconciler_lag_seconds", "How long the live job waiting longest for a "
                             "reconciler decision has waited past its due time (0: none waits)", value=lag)


def price_freshness(session: Session, now: datetime) -> Iterator[Metric]:
    rows = {row.source: row for row in session.scalars(select(PriceSourceLease))}
    sources = sorted({*PricingSettings().sources, *rows})
    last = GaugeMetricFamily("spotbroker_price_source_last_success_timestamp_seconds", "When a price source's "
                             "last refresh succeeded, as a Unix time (0: never)", labels=["source"])
    age = GaugeMetricFamily("spotbroker_price_source_age_seconds", "Seconds since a price source's last successful "
                            "refresh (+Inf: never)", labels=["source"])
    failing = GaugeMetricFamily("spotbroker_price_source_failing", "1 when a price source's last refresh failed "
                                "(its offers keep their previous prices)", labels=["source"])
    for source in sources:
        row = rows.get(source)
        ok = _utc(row.last_ok_at) if row is not None and row.last_ok_at is not None else None
        last.add_metric([source], ok.timestamp() if ok else 0.0)
        age.add_metric([source], max(0.0, (now - ok).total_seconds()) if ok else math.inf)
        failing.add_metric([source], 1.0 if row is not None and row.last_error else 0.0)
    yield from (last, age, failing)


def collect(session: Session, now: datetime) -> Iterator[Metric]:
    yield reconciler_lag(session, now)
    yield from price_freshness(session, now)
