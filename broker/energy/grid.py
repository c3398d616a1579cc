"""Grid carbon intensity per cloud region (g CO2e per kWh).

The bundled snapshot (data/grid_intensity.csv) covers every region the
price catalog offers, each row with its source and year. A region it does
not know gets its cloud's median with that said in the source, so a figure
is never silently made up.
"""
from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from datetime import date
from functools import cache
from importlib import resources

SNAPSHOT = "snapshot"


@dataclass(frozen=True)
class Intensity:
    g_per_kwh: float
    source: str        # the row's source key (data/README.md), "electricitymaps" when live
    basis: str         # what the figure stands for: a NERC region, a country, a region's own figure
    as_of: str         # the year of the figure, or the live reading's time
    zone: str | None   # Electricity Maps zone of the region's grid

    @property
    def estimated(self) -> bool:
        """True when the region is not in the snapshot (its cloud's median stands in)."""
        return self.source.startswith("median of")


def _open(name: str):
    return resources.files("spotbroker.broker.energy").joinpath("data", name).open(encoding="utf-8")


@cache
def snapshot() -> dict[tuple[str, str], Intensity]:
    with _open("grid_intensity.csv") as f:
        return {(r["cloud"], r["region"]): Intensity(float(r["g_co2e_per_kwh"]), r["source"], r["basis"], r["year"],
                                                     r["electricitymaps_zone"] or None)
                for r in csv.DictReader(f)}


def snapshot_date() -> date:
    with _open("SNAPSHOT_DATE") as f:
        return date.fromisoformat(f.read().strip())


@cache
def _cloud_median(cloud: str) -> float:
    values = [v.g_per_kwh for (c, _), v in snapshot().items() if c == cloud]
    return statistics.median(values or [v.g_per_kwh for v in snapshot().values()])


def intensity(cloud: str, region: str) -> Intensity:
    """The snapshot's figure for a region, or its cloud's median, marked so."""
    known = snapshot().get((cloud, region))
    if known is not None:
        return known
    return Intensity(_cloud_median(cloud), f"median of {cloud}'s regions in the snapshot", "region not in the snapshot",
                     snapshot_date().isoformat(), None)
