"""Run a named arm over windows of a trace set: what the CLI and the bench call."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from spotbroker.broker.placement.policy.model import Policy
from spotbroker.broker.sim.baselines import (
    Greedy,
    UniformProgress,
    UniformProgressMultiZone,
)
from spotbroker.broker.sim.engine import Job, RunResult, run_window
from spotbroker.broker.sim.memory import observed_before
from spotbroker.broker.sim.optimal import PlanReplay, solve
from spotbroker.broker.sim.traces import TraceError, TraceSet

ARMS = ("spotbroker", "optimal", "up", "up-s", "greedy", "skynomad")


@dataclass(frozen=True)
class WindowRun:
    start_tick: int
    zone: str | None  # the single zone of an `up` run, else None
    result: RunResult


def job_from_hours(job_hours: float, deadline_hours: float, restart_hours: float, checkpoint_gb: float) -> Job:
    """Hours become whole seconds, rounded to the nearest (59.90833 h -> 215,670 s)."""
    for label, value in (("--job-hours", job_hours), ("--deadline-hours", deadline_hours),
                         ("--restart-hours", restart_hours), ("--checkpoint-gb", checkpoint_gb)):
        if not math.isfinite(value) or value < 0:
            raise TraceError(f"{label} must be a non-negative number, got {value}")
    return Job(
        work_s=float(round(job_hours * 3600)),
        deadline_s=float(round(deadline_hours * 3600)),
        restart_s=float(round(restart_hours * 3600)),
        checkpoint_gb=checkpoint_gb,
    )


def policy_factory(name: str) -> Callable[[], Policy]:
    if name == "spotbroker":
        from spotbroker.broker.placement.policy.spotbroker import SpotBroker

        return SpotBroker
    if name == "up-s":
        return UniformProgressMultiZone
    if name == "greedy":
        return Greedy
    if name == "up":
        return UniformProgress
    if name == "skynomad":
        from spotbroker.broker.sim.skynomad import SkyNomad

        return SkyNomad
    raise TraceError(f"unknown policy {name!r} (choose from {', '.join(ARMS)})")


def check_windows(traces: TraceSet, job: Job, start_ticks: list[int]) -> None:
    if not start_ticks:
        raise TraceError("no start ticks given")
    if len(set(start_ticks)) != len(start_ticks):
        raise TraceError("a start tick is named twice")
    need = job.window_ticks(traces.gap_s) + 1  # the oracle and the final preemption check read one more
    for s in start_ticks:
        if s < 0 or s + need > traces.n_ticks:
            raise TraceError(
                f"window starting at tick {s} runs past the end of the trace ({traces.n_ticks} ticks; "
                f"a window needs {need}, so the last valid start is {traces.n_ticks - need})"
            )


def run_arm(name: str, traces: TraceSet, job: Job, start_ticks: list[int],
            keep_timeline: bool = False, memory_ticks: int = 0,
            memory_half_life_s: float | None = None) -> list[WindowRun]:
    """Every window (and for `up`, every zone × window) of one arm.

    `memory_ticks` > 0 (spotbroker only; not the protocol's rule) starts each
    window with the zones' histories over that many ticks before it
    (`memory.observed_before`): what a broker running earlier jobs would know."""
    check_windows(traces, job, start_ticks)
    if memory_ticks and name != "spotbroker":
        raise TraceError(f"a memory before the window is for the spotbroker arm only, not {name!r}")
    runs: list[WindowRun] = []
    for start in start_ticks:
        window = traces.window(start, traces.n_ticks - start)
        if name == "optimal":
            plan = solve(window, job)
            result = run_window(window, PlanReplay(plan, window.names), job, safety_net=False,
                                keep_timeline=keep_timeline)
            runs.append(WindowRun(start, None, result))
        elif name == "up":
            for zone in window.zones:
                single = TraceSet((zone,), window.gap_s)
                result = run_window(single, UniformProgress(), job, safety_net=False, bill_last_interval=True,
                                    keep_timeline=keep_timeline)
                runs.append(WindowRun(start, zone.zone, result))
        else:
            make = policy_factory(name)
            histories = observed_before(traces, start, memory_ticks, memory_half_life_s) if memory_ticks else None
            result = run_window(window, make(), job, keep_timeline=keep_timeline, histories=histories)
            runs.append(WindowRun(start, None, result))
    return runs
