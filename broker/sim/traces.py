"""Spot availability and price traces (the format of `data/traces/*/README.md`).

A trace set is a directory of JSON files, one per zone:

    {"metadata": {"gap_seconds": 195,
                  "price_info": {"on_demand_price": 3.06, "price": 0.918}},
     "data":   [1, 0, ...],     # 1 = spot unavailable (preempted) in that tick
     "prices": [1.2, ...]}      # spot $/h per tick; optional (flat `price` instead)

Zone `Z` is the file `DIR/Z.json`, or else the one file `DIR/Z_*.json` (the
bundled files are named `us-east-1c_v100_1.json`). Either way the zone is
the cloud's own name (`metadata.price_info.zone`, else the file's name up to
its first `_`), so its region, and with it what moving a checkpoint costs,
is the same whichever name found the file. Everything the loader
rejects raises `TraceError`, whose message names the problem; the CLI prints
it as one line.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spotbroker.broker.placement.policy.egress import region_of


class TraceError(ValueError):
    """A trace set or a simulation window that cannot be simulated."""


@dataclass(frozen=True)
class ZoneTrace:
    zone: str
    region: str
    gap_s: int
    unavailable: np.ndarray  # bool per tick: True = spot cannot run in [t, t+1)
    spot_price: np.ndarray  # $/h per tick
    on_demand_price: float  # $/h


@dataclass(frozen=True)
class TraceSet:
    """Zones of one trace set, aligned tick by tick, in the order they were named.

    The order matters: it breaks ties in every policy (the protocol's r0, r1, …).
    """

    zones: tuple[ZoneTrace, ...]
    gap_s: int

    @property
    def n_ticks(self) -> int:
        return len(self.zones[0].unavailable)

    @property
    def names(self) -> list[str]:
        return [z.zone for z in self.zones]

    def window(self, start_tick: int, n_ticks: int) -> TraceSet:
        """The ticks [start, end of trace) — policies see ticks ≥ n_ticks as unavailable
        (the simulator's rule); the oracle may read past the window's end."""
        if start_tick < 0 or start_tick + n_ticks > self.n_ticks:
            raise TraceError(
                f"window starting at tick {start_tick} needs {n_ticks} ticks but the trace has "
                f"{self.n_ticks} (last valid start tick: {self.n_ticks - n_ticks})"
            )
        return TraceSet(
            zones=tuple(
                ZoneTrace(z.zone, z.region, z.gap_s, z.unavailable[start_tick:], z.spot_price[start_tick:],
                          z.on_demand_price)
                for z in self.zones
            ),
            gap_s=self.gap_s,
        )

    def replace_after(self, tick: int, other: TraceSet) -> TraceSet:
        """Ticks ≤ `tick` from self, later ticks from `other` (used to prove a policy
        never looks ahead)."""
        zones = []
        for a, b in zip(self.zones, other.zones):
            unavailable = a.unavailable.copy()
            price = a.spot_price.copy()
            unavailable[tick + 1:] = b.unavailable[tick + 1:len(unavailable)]
            price[tick + 1:] = b.spot_price[tick + 1:len(price)]
            zones.append(ZoneTrace(a.zone, a.region, a.gap_s, unavailable, price, a.on_demand_price))
        return TraceSet(tuple(zones), self.gap_s)


def _zone_file(directory: Path, zone: str) -> Path:
    exact = directory / f"{zone}.json"
    if exact.is_file():
        return exact
    matches = sorted(directory.glob(f"{zone}_*.json"))
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        names = ", ".join(p.name for p in matches)
        raise TraceError(f"zone {zone!r} is ambiguous in {directory}: {names}")
    raise TraceError(f"zone {zone!r}: no file {zone}.json or {zone}_*.json in {directory}")


def _load_zone(path: Path) -> ZoneTrace:
    try:
        raw = json.loads(path.read_text())
        meta = raw["metadata"]
        gap = meta["gap_seconds"]
        on_demand = float(meta["price_info"]["on_demand_price"])
        data = np.asarray(raw["data"], dtype=float)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TraceError(f"{path}: not a trace file ({type(exc).__name__}: {exc})") from None
    if not isinstance(gap, (int, float)) or gap <= 0 or gap != int(gap):
        raise TraceError(f"{path}: metadata.gap_seconds must be a positive whole number, got {gap!r}")
    if data.ndim != 1 or len(data) == 0 or not np.isin(data, (0, 1)).all():
        raise TraceError(f"{path}: `data` must be a non-empty list of 0/1")
    prices = raw.get("prices")
    if prices is not None:
        spot = np.asarray(prices, dtype=float)
        if spot.shape != data.shape:
            raise TraceError(f"{path}: `prices` has {len(spot)} entries but `data` has {len(data)}")
    else:
        try:
            spot = np.full(len(data), float(meta["price_info"]["price"]))
        except (KeyError, TypeError, ValueError):
            raise TraceError(f"{path}: needs `prices` or metadata.price_info.price") from None
    if not (np.isfinite(spot).all() and (spot >= 0).all() and math.isfinite(on_demand) and on_demand > 0):
        raise TraceError(f"{path}: prices must be finite and non-negative")
    name = _cloud_zone(path, meta)
    return ZoneTrace(name, region_of(name), int(gap), data == 1, spot, on_demand)


def _cloud_zone(path: Path, meta: dict) -> str:
    """The zone's own name: `us-east-1c` for `us-east-1c_v100_1.json`, which a
    region can be read from (a file's stem, device and count included, has none)."""
    named = meta.get("price_info", {}).get("zone")
    if isinstance(named, str) and named.strip():
        return named.strip()
    return path.stem.split("_", 1)[0]


def load_traces(directory: str | Path, zones: list[str]) -> TraceSet:
    """Load and align the named zones; raise `TraceError` naming what is wrong."""
    directory = Path(directory)
    if not directory.is_dir():
        raise TraceError(f"trace directory {directory} does not exist")
    if not zones:
        raise TraceError("no zones given")
    seen: set[str] = set()
    for zone in zones:
        if zone in seen:
            raise TraceError(f"zone {zone!r} is named twice")
        seen.add(zone)
    loaded = [_load_zone(_zone_file(directory, z)) for z in zones]
    for z, given in zip(loaded, zones):
        if sum(other.zone == z.zone for other in loaded) > 1:
            raise TraceError(f"zone {z.zone!r} is named twice (as {given!r} among others)")
    first = loaded[0]
    for z in loaded[1:]:
        if z.gap_s != first.gap_s:
            raise TraceError(
                f"traces have different tick lengths: {first.zone} {first.gap_s} s, {z.zone} {z.gap_s} s"
            )
        if len(z.unavailable) != len(first.unavailable):
            raise TraceError(
                f"traces have different lengths: {first.zone} {len(first.unavailable)} ticks, "
                f"{z.zone} {len(z.unavailable)} ticks"
            )
    return TraceSet(tuple(loaded), first.gap_s)
