"""Every background duty of a broker process, in one list.

What runs beside the API in `serve`: this broker's row among the
brokers on its database (broker/replicas.py), the reconciler, the price tracker (a
thread per source), the money loop (accrual, alerts, the hard cap,
notifications, the cold tier), with an Electricity Maps key the grids' live
carbon intensity, SkyPilot's import ahead of the first task file, and, with
SPOTBROKER_LAUNCHER=skypilot, the SkyPilot janitor (the launcher's follower is the launcher's own thread, and
wakes the reconciler), and with the local launcher the pruning of its ended
runs' directories. The app (api/app.py) builds the list once, starts it
after the database is ready and stops it before the engine goes; nothing
else in the broker or the API starts a thread.

Several brokers may share one database, each with this same list: a duty
that must run in one of them at a time takes a lease first (a price source,
accrual, alerts, the cold tier, the metrics: broker/store/leases.py; each
job the reconciler steps: the job's row lease, see that module for why it
differs). The price tracker and the money loop tick with
broker/ticker.py's `run_every`. The reconciler keeps its own loop (a pass
that stepped something goes again at once, and a burst of hints shares one
pass), and so does the janitor (two periods, the check and the sweep, after
waiting for SkyPilot's API server).
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from spotbroker.broker import replicas
from spotbroker.broker.clock import Clock
from spotbroker.broker.energy import tracker as energy_tracker
from spotbroker.broker.energy.settings import EnergySettings, energy_settings
from spotbroker.broker.launch import local_runs
from spotbroker.broker.launch.skypilot import startup as skypilot
from spotbroker.broker.money import leases as money_leases
from spotbroker.broker.money.loop import MoneyLoop
from spotbroker.broker.money.settings import get_money_settings
from spotbroker.broker.pricing.settings import get_pricing_settings
from spotbroker.broker.pricing.sources import build_source
from spotbroker.broker.pricing.tracker import PriceTracker
from spotbroker.broker.reconciler import Reconciler
from spotbroker.broker.settings import Settings
from spotbroker.broker.store.sealing import Keyring
from spotbroker.broker.ticker import run_every
from spotbroker.broker.usecases import taskyaml

log = logging.getLogger("spotbroker")


@dataclass
class Duty:
    """One kind of background work: `start(stop)` starts its threads, which
    end once `stop` is set; `wake` makes them notice it at once."""

    name: str
    start: Callable[[threading.Event], list[threading.Thread]]
    wake: Callable[[], None] = lambda: None
    join_s: float = 30.0


class Background:
    """The duties of one broker process, started together and stopped in
    the reverse order (the money loop's hard cap hints the reconciler, so
    the reconciler outlives it)."""

    def __init__(self, duties: list[Duty]) -> None:
        self.duties = duties
        self._stop = threading.Event()
        self._threads: list[tuple[Duty, list[threading.Thread]]] = []

    def start(self) -> None:
        for duty in self.duties:
            self._threads.append((duty, duty.start(self._stop)))

    def stop(self) -> None:
        self._stop.set()
        for duty, threads in reversed(self._threads):
            duty.wake()
            for t in threads:
                t.join(timeout=duty.join_s)
                if t.is_alive() and duty.join_s:
                    log.warning("background: %s did not end within %g s", t.name, duty.join_s)
        self._threads.clear()


def _one(target: Callable[[threading.Event], None], name: str) -> Callable[[threading.Event], list[threading.Thread]]:
    def start(stop: threading.Event) -> list[threading.Thread]:
        t = threading.Thread(target=target, args=(stop,), name=name, daemon=True)
        t.start()
        return [t]

    return start


def _registered(registration: replicas.Registration) -> Callable[[threading.Event], list[threading.Thread]]:
    """This broker's row written at once, then kept fresh (and removed at the stop) by its thread."""
    def start(stop: threading.Event) -> list[threading.Thread]:
        registration.join()
        return _one(registration.keep, "replica")(stop)

    return start


def duties(settings: Settings, factory: sessionmaker[Session], launchers: dict, reconciler: Reconciler, *,
           clock: Clock, keyring: Keyring, run_reconciler: bool = True) -> tuple[list[Duty], dict]:
    """The broker's duties, and the objects behind them that others call
    (`money`: the money loop, `prices`: the price tracker). With
    SPOTBROKER_LAUNCHER=skypilot the SkyPilot launcher joins `launchers`
    here. `run_reconciler=False` leaves the reconciler to the caller (tests
    drive it pass by pass)."""
    listed: list[Duty] = [Duty("replica", _registered(replicas.Registration(factory, replicas.Shared.of(settings),
                                                                           clock)), join_s=5.0)]
    if run_reconciler:
        listed.append(Duty("reconciler", _one(reconciler.run_forever, "reconciler"), wake=reconciler.hint,
                           join_s=10.0))
    janitor = skypilot.prepare(settings, factory, launchers, reconciler.hint)
    if janitor is not None:  # not waited for: it may be inside a slow SkyPilot call, and ends with the process
        listed.append(Duty("skypilot-janitor", _one(janitor, "skypilot-janitor"), join_s=0.0))
    prices = _price_tracker(factory, clock)
    pricing = get_pricing_settings()
    # The snapshot was loaded when the app started: its next read is an interval away.
    listed.append(Duty("prices", lambda stop: prices.start(stop, first_delay={"catalog": pricing.catalog_interval}),
                       join_s=pricing.timeout + 5))
    money = MoneyLoop(factory, get_money_settings(), clock=clock, on_stopped=reconciler.hint, keyring=keyring)
    listed.append(Duty("money", lambda stop: [money.start(stop)], wake=money.hint))
    energy = energy_settings()
    if energy.electricitymaps_token is not None:  # the grids' live intensity (else the snapshot's figures)
        listed.append(Duty("grid-intensity", _one(lambda stop: grid_readings(stop, factory, energy, clock),
                                                  "grid-intensity"), join_s=energy.timeout + 5))
    if "local" in launchers:
        listed.append(Duty("local-runs", _one(lambda stop: prune_local_runs(stop, factory, settings, clock),
                                              "local-runs")))
    if settings.preload_skypilot and "sky" not in sys.modules:  # once: the first task file's import, ahead of it
        listed.append(Duty("preload-skypilot", _one(lambda stop: taskyaml.preload(), "preload-skypilot"), join_s=0.0))
    return listed, {"money": money, "prices": prices}


def grid_readings(stop: threading.Event, factory: sessionmaker[Session], settings: EnergySettings,
                  clock: Clock) -> None:
    """Electricity Maps' latest reading of each grid, every `refresh_interval`, in
    one broker of several at a time (the `grid-intensity` money lease)."""
    owner = f"{socket.gethostname()}-{os.getpid()}-grid"

    def turn() -> None:
        try:
            taken, _ = money_leases.claim(factory, "grid-intensity", owner, clock.now(),
                                          every_s=settings.refresh_interval, hold_s=settings.timeout * 10 + 60)
            if taken:
                energy_tracker.refresh(factory, settings, clock.now())
        except Exception:  # one failed turn must not end the loop
            log.exception("grid intensity: the refresh failed")

    run_every(stop, settings.refresh_interval / 4, turn)


def prune_local_runs(stop: threading.Event, factory: sessionmaker[Session], settings: Settings,
                     clock: Clock) -> None:
    """The local launcher's ended runs' directories, removed once kept for
    SPOTBROKER_LOCAL_RUN_RETENTION_SECONDS (each broker its own disk)."""
    keep = settings.local_run_retention_seconds

    def turn() -> None:
        try:
            local_runs.prune(factory, settings.data_dir, clock.now(), keep)
        except Exception:  # one failed turn must not end the loop
            log.exception("local runs: pruning failed")

    run_every(stop, min(3600.0, keep / 4), turn, first_delay=60.0)


def _price_tracker(factory: sessionmaker[Session], clock: Clock) -> PriceTracker:
    settings = get_pricing_settings()
    sources = {}
    for name in settings.sources:
        try:
            sources[name] = build_source(name, settings, factory)
        except Exception as exc:  # e.g. a cloud SDK not installed: the others still run
            log.warning("prices: %s skipped (%s: %s)", name, type(exc).__name__, exc)
    return PriceTracker(factory, sources, settings, clock=clock)
