"""The janitor: no SkyPilot cluster of this broker bills without an owner.

A broker can crash between a launch and storing its handle, a `sky.down`
can fail, an attempt can end while its launch is still in flight. Every
`interval` the janitor lists SkyPilot's clusters named with the broker's
prefix (`{prefix}-{attempt id}`) and downs every one whose attempt is not
live, cancelling its launch first if one is still in flight.

Clusters are listed before attempts are read: an attempt row is committed
before its launch is sent, so a cluster listed has its attempt in the
table by the time the table is read, and a launch in progress is never
taken for an orphan.
"""
from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.jobs.states import LIVE_ATTEMPT_STATES
from spotbroker.broker.launch.skypilot.follow import IN_FLIGHT
from spotbroker.broker.store.models import Attempt

log = logging.getLogger(__name__)


def owned_clusters(sky, prefix: str) -> dict[str, int]:
    """This broker's clusters, by name -> attempt id (SkyPilot's whole table, one request)."""
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)$")
    names = [r["name"] for r in sky.get(sky.status())]
    names += [r.cluster_name for r in sky.api_status() if r.cluster_name and r.status in IN_FLIGHT]
    return {name: int(m.group(1)) for name in names if (m := pattern.match(name))}


def live_attempts(factory: sessionmaker[Session], ids: list[int]) -> set[int]:
    if not ids:
        return set()
    with factory() as session:
        return set(session.scalars(select(Attempt.id).where(
            Attempt.id.in_(ids), Attempt.launcher == "skypilot",
            Attempt.state.in_([str(s) for s in LIVE_ATTEMPT_STATES]))))


def sweep(launcher, factory: sessionmaker[Session]) -> list[str]:
    """Down every cluster of this broker that no live attempt owns; returns their names."""
    clusters = owned_clusters(launcher.sky, launcher.prefix)
    live = live_attempts(factory, list(set(clusters.values())))
    orphans = sorted(name for name, attempt_id in clusters.items() if attempt_id not in live)
    for name in orphans:
        flying = [r.request_id for r in launcher.sky.api_status(cluster_name=name)
                  if r.status in IN_FLIGHT and r.name.endswith("launch")]
        log.warning("janitor: cluster %s has no live attempt: tearing it down", name)
        try:
            for request_id in flying:
                launcher.sky.api_cancel(request_id, silent=True)
            launcher.sky.down(name)
        except Exception as exc:  # the next sweep tries again
            log.warning("janitor: tearing down %s failed: %s", name, exc)
    return orphans


def run_janitor(launcher, factory: sessionmaker[Session], interval: float, stop: threading.Event,
                on_sweep: Callable[[list[str]], None] | None = None) -> None:
    """Sweep at once (a broker that starts may follow one that crashed), then every `interval`;
    each time, refresh the clouds SkyPilot reports enabled (placement's limit)."""
    while not stop.is_set():
        try:
            clouds = launcher.refresh_clouds()
            log.info("SkyPilot's enabled clouds: %s", ", ".join(sorted(clouds)) or "none")
        except Exception:
            log.warning("asking SkyPilot for its enabled clouds failed", exc_info=True)
        try:
            downed = sweep(launcher, factory)
            if on_sweep is not None:
                on_sweep(downed)
        except Exception:
            log.warning("janitor sweep failed", exc_info=True)
        stop.wait(interval)
