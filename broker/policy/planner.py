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

import numpy as np

MAX_GRID = 600  # steps of the whole horizon at most; coarser steps beyond that


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
    """Expected $ to finish from each state: `values[table, w, s]` (tables below)."""

    inputs: PlanInputs
    values: np.ndarray

    def cell(self, work_left_s: float, slack_s: float) -> tuple[int, int]:
        u = self.inputs.unit_s
        w = min(max(math.ceil(work_left_s / u - 1e-9), 0), self.inputs.w_max)
        s = min(max(math.floor(slack_s / u + 1e-9), 0), self.inputs.s_max)
        return w, s

    def value(self, table: int, work_left_s: float, slack_s: float) -> float:
        w, s = self.cell(work_left_s, slack_s)
        return float(self.values[table, w, s])


def plan_inputs(unit_s: float, work_total_s: float, horizon_s: float, up_mean_s: float, down_mean_s: float,
                spot_price: float, od_price: float, restart_s: float, resolution: float = 0.1) -> PlanInputs:
    """Inputs for a job whose work and time fit in (`work_total_s`, `horizon_s`).
    Rates and prices are rounded to `resolution` (relative) so that plans are reused."""
    def q(x: float) -> float:
        return math.exp(round(math.log(max(x, 1e-12)) / resolution) * resolution)

    return PlanInputs(
        unit_s=unit_s,
        w_max=math.ceil(work_total_s / unit_s),
        s_max=math.ceil(horizon_s / unit_s),
        a=1 - math.exp(-unit_s / q(up_mean_s)),
        b=1 - math.exp(-unit_s / q(down_mean_s)),
        spot_step=q(spot_price) * unit_s / 3600,
        od_step=q(od_price) * unit_s / 3600,
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
    W, S, h = p.w_max, p.s_max, p.h
    a, b, cs, co = p.a, p.b, p.spot_step, p.od_step
    V = np.full((12, W + 1, S + 1), np.inf)
    V[:, 0, :] = 0.0  # no work left: done
    for diag in range(1, W + S + 1):
        w = np.arange(max(1, diag - S), min(W, diag) + 1)
        s = diag - w
        prev = V[:, w - 1, s]  # one step of work done
        spot_run = cs + (1 - a) * prev[SPOT_RUN] + a * prev[IDLE_DOWN]
        run_od_up = co + (1 - a) * prev[OD_UP] + a * prev[OD_DOWN]
        run_od_down = co + b * prev[OD_UP] + (1 - b) * prev[OD_DOWN]
        waited = V[:, w, np.maximum(s - 1, 0)]  # one step of slack spent
        wait_up = np.where(s >= 1, (1 - a) * waited[IDLE_UP] + a * waited[IDLE_DOWN], np.inf)
        wait_down = np.where(s >= 1, b * waited[IDLE_UP] + (1 - b) * waited[IDLE_DOWN], np.inf)
        # launching spot spends h of slack; the reserve for a last switch to on-demand stays
        launch_spot = np.where(s >= h, h * cs + V[SPOT_RUN, w, np.maximum(s - h, 0)], np.inf)
        launch_od_up = h * co + run_od_up
        launch_od_down = h * co + run_od_down
        V[SPOT_RUN, w, s] = spot_run
        V[LAUNCH_SPOT, w, s] = launch_spot
        V[LAUNCH_OD_UP, w, s] = launch_od_up
        V[LAUNCH_OD_DOWN, w, s] = launch_od_down
        V[RUN_OD_UP, w, s] = run_od_up
        V[RUN_OD_DOWN, w, s] = run_od_down
        V[WAIT_UP, w, s] = wait_up
        V[WAIT_DOWN, w, s] = wait_down
        V[IDLE_UP, w, s] = np.minimum(np.minimum(wait_up, launch_spot), launch_od_up)
        V[IDLE_DOWN, w, s] = np.minimum(wait_down, launch_od_down)
        V[OD_UP, w, s] = np.minimum(run_od_up, launch_spot)
        V[OD_DOWN, w, s] = run_od_down
    return Plan(p, V)
