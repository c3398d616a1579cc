"""Wait, spot or on-demand: a small Markov decision process for the home zone.

The home zone's spot capacity is an on/off Markov chain: an up step turns
down with probability `a`, a down step comes back up with probability `b`
(from the learned spell lengths). The job's state is (w, s, spot up?, what
runs): w = work steps left, s = slack steps left (time left − work − one
restart kept for a last switch to on-demand). Each step:

* on spot (up): pay a spot step, w − 1; reclaimed with probability `a`;
* on on-demand: pay an on-demand step, w − 1 (s unchanged);
* idle: pay nothing, s − 1 (waiting spends slack);
* a launch pays `h` steps of overhead at its price and spends `h` of slack;
  launching spot needs s ≥ h (the last restart stays reserved); launching
  on-demand may spend the reserve, after which the job stays on it.

The expected cost of finishing from every state is solved once by dynamic
programming (along anti-diagonals w + s, which depend only on smaller ones, so
each is one vectorised numpy step) and then read in O(1) per decision. The
plan is re-solved only when the inputs move by a few per cent, and its grid
is capped so a solve stays in the milliseconds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

PRICE_RESOLUTION = 0.01
MAX_GRID = 300  # steps of the whole horizon at most; coarser steps beyond that


@dataclass(frozen=True)
class PlanInputs:
    unit_s: float  # one DP step
    w_max: int
    s_max: int
    a: float  # P(up -> down) per step
    b: float  # P(down -> up) per step
    spot_step: float  # $ per step on spot
    od_step: float  # $ per step on on-demand
    h: int  # restart overhead in steps


@dataclass(frozen=True)
class Plan:
    """Expected $ to finish from each state (w, s): `values[w + s, table, s]` (tables below)."""

    inputs: PlanInputs
    values: np.ndarray

    def cell(self, work_left_s: float, slack_s: float) -> tuple[int, int]:
        u = self.inputs.unit_s
        w = min(max(math.ceil(work_left_s / u - 1e-9), 0), self.inputs.w_max)
        s = min(max(math.floor(slack_s / u + 1e-9), 0), self.inputs.s_max)
        return w, s

    def value(self, table: int, work_left_s: float, slack_s: float) -> float:
        w, s = self.cell(work_left_s, slack_s)
        return float(self.values[w + s, table, s])


def plan_inputs(unit_s: float, work_total_s: float, horizon_s: float, up_mean_s: float, down_mean_s: float,
                spot_price: float, od_price: float, restart_s: float, resolution: float = 0.2) -> PlanInputs:
    """Inputs for a job whose work and slack fit in (`work_total_s`, `horizon_s`).
    Spell lengths are rounded to `resolution` (relative, in log space) and prices
    to PRICE_RESOLUTION, so that plans are reused while the estimates drift."""
    def q(x: float, res: float = resolution) -> float:
        return math.exp(round(math.log(max(x, 1e-12)) / res) * res)

    return PlanInputs(
        unit_s=unit_s,
        w_max=math.ceil(work_total_s / unit_s),
        s_max=math.ceil(horizon_s / unit_s),
        a=1 - math.exp(-unit_s / q(up_mean_s)),
        b=1 - math.exp(-unit_s / q(down_mean_s)),
        spot_step=q(spot_price, PRICE_RESOLUTION) * unit_s / 3600,
        od_step=q(od_price, PRICE_RESOLUTION) * unit_s / 3600,
        h=max(1, round(restart_s / unit_s)),
    )


def step_for(step_s: float, horizon_s: float) -> float:
    """The DP step: the caller's step, or a whole multiple of it so the grid stays small."""
    return step_s * max(1, math.ceil(horizon_s / (MAX_GRID * step_s)))


# value tables, one per (what runs, spot up?) pair, stacked in one array
IDLE_UP, IDLE_DOWN, OD_UP, OD_DOWN, SPOT_RUN, LAUNCH_SPOT, LAUNCH_OD_UP, LAUNCH_OD_DOWN, \
    RUN_OD_UP, RUN_OD_DOWN, WAIT_UP, WAIT_DOWN = range(12)


@lru_cache(maxsize=32)
def solve(p: PlanInputs) -> Plan:
    """Values on anti-diagonals n = w + s: `values[n, table, s]` is the state (n - s, s).
    Every term a state needs lies on diagonal n - 1 (one step of work, or one
    step of waiting: index s - 1) or n - h (a launch's overhead: index s - h),
    so each diagonal is a few vectorised slices of the ones before it."""
    import numpy as np  # here, not at the top: a broker that never solves a plan (local jobs) starts without it
    W, S, h = p.w_max, p.s_max, p.h
    a, b, cs, co = p.a, p.b, p.spot_step, p.od_step
    N = W + S
    V = np.full((N + 1, 12, S + 1), np.inf)
    s = np.arange(S + 1)
    for n in range(min(N, S) + 1):
        V[n, :, n] = 0.0  # w = 0: done
    inf_row = np.full(S + 1, np.inf)
    for n in range(1, N + 1):
        w = n - s
        prev = V[n - 1]  # (w - 1, s): same s one diagonal back
        spot_run = cs + (1 - a) * prev[SPOT_RUN] + a * prev[IDLE_DOWN]
        run_od_up = co + (1 - a) * prev[OD_UP] + a * prev[OD_DOWN]
        run_od_down = co + b * prev[OD_UP] + (1 - b) * prev[OD_DOWN]
        wait_up = inf_row.copy()  # (w, s - 1): one diagonal back, one index down
        wait_up[1:] = (1 - a) * prev[IDLE_UP, :-1] + a * prev[IDLE_DOWN, :-1]
        wait_down = inf_row.copy()
        wait_down[1:] = b * prev[IDLE_UP, :-1] + (1 - b) * prev[IDLE_DOWN, :-1]
        # launching spot spends h of slack; the reserve for a last switch to on-demand stays
        launch_spot = inf_row.copy()
        if n - h >= 0 and h <= S:
            launch_spot[h:] = h * cs + V[n - h, SPOT_RUN, : S + 1 - h]
        row = V[n]
        row[SPOT_RUN] = spot_run
        row[LAUNCH_SPOT] = launch_spot
        row[LAUNCH_OD_UP] = h * co + run_od_up
        row[LAUNCH_OD_DOWN] = h * co + run_od_down
        row[RUN_OD_UP] = run_od_up
        row[RUN_OD_DOWN] = run_od_down
        row[WAIT_UP] = wait_up
        row[WAIT_DOWN] = wait_down
        row[IDLE_UP] = np.minimum(np.minimum(wait_up, launch_spot), row[LAUNCH_OD_UP])
        row[IDLE_DOWN] = np.minimum(wait_down, row[LAUNCH_OD_DOWN])
        row[OD_UP] = np.minimum(run_od_up, launch_spot)
        row[OD_DOWN] = run_od_down
        row[:, (w > W) | (w < 0)] = np.inf
        row[:, w == 0] = 0.0
    return Plan(p, V)
