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
import time
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker.jobs.states import LIVE_ATTEMPT_STATES
from spotbroker.broker.launch.skypilot.errors import server_unreachable
from spotbroker.broker.launch.skypilot.follow import IN_FLIGHT
from spotbroker.broker.store.models import Attempt

log = logging.getLogger(__name__)

# A broker is not ready to launch until `sky check` has answered once: a first
# check that failed (an API server still starting, a loaded host) is asked
# again after 1 s, 2 s, 4 s ... up to the check interval, not a whole interval later.
FIRST_RETRY_S = 1.0


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
                on_sweep: Callable[[list[str]], None] | None = None, check_interval: float | None = None) -> None:
    """First wait for SkyPilot's API server (a local one is started; the
    launcher sends no launch until then). Then, every `check_interval`,
    make sure it still answers and refresh the clouds `sky check` enables
    (placement's limit); sweep at once (a broker that starts may follow one
    that crashed), then every `interval`."""
    check_interval = interval if check_interval is None else check_interval
    if not launcher.server.wait_until_up(stop):
        return
    next_sweep, retry = 0.0, FIRST_RETRY_S
    while not stop.is_set():
        if check(launcher) or launcher.enabled_clouds() is not None:
            wait_s, retry = check_interval, FIRST_RETRY_S
        else:  # never answered yet: the broker cannot launch until it is, so ask again soon
            wait_s, retry = min(retry, check_interval), retry * 2
        if time.monotonic() >= next_sweep:
            next_sweep = time.monotonic() + interval
            try:
                downed = sweep(launcher, factory)
                if on_sweep is not None:
                    on_sweep(downed)
            except Exception as exc:
                if server_unreachable(exc):
                    launcher.server.unavailable(exc)
                else:
                    log.warning("janitor sweep failed", exc_info=True)
        _wait(launcher.server.wanted, stop, max(0.0, min(wait_s, next_sweep - time.monotonic())))


def _wait(wanted: threading.Event, stop: threading.Event, seconds: float) -> None:
    """Until `stop`, `seconds` gone, or a launch that met no server wants a probe now."""
    until = time.monotonic() + seconds
    while not stop.is_set() and not wanted.is_set() and (left := until - time.monotonic()) > 0:
        stop.wait(min(left, 0.5))


def check(launcher) -> bool:
    """Ask whether SkyPilot's API server answers (starting a local one) and,
    if it does, which clouds `sky check` enables now. Whether it answered."""
    try:
        launcher.server.probe()
        clouds = launcher.refresh_clouds()
    except Exception as exc:  # LauncherUnavailable included: the next check asks again
        if server_unreachable(exc):
            launcher.server.unavailable(exc)
        log.warning("asking SkyPilot for its enabled clouds failed: %s", exc)
        return False
    if clouds != launcher.last_logged_clouds:
        launcher.last_logged_clouds = clouds
        log.info("SkyPilot's enabled clouds: %s", ", ".join(sorted(clouds)) or "none")
    return True
