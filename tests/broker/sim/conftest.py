"""Shared fixtures: the bundled trace sets (bench/traces, copied unchanged from the
shared data with their licence) and
each arm's protocol results, computed once per test session."""
from __future__ import annotations

from pathlib import Path

import pytest

from spotbroker.broker.sim.runner import WindowRun, job_from_hours, run_arm
from spotbroker.broker.sim.traces import TraceSet, load_traces

REPO = Path(__file__).resolve().parents[3]
TRACES = REPO / "bench" / "traces"
V100_DIR = TRACES / "aws-v100-2023"
V100_600S_DIR = TRACES / "aws-v100-4node-600s"

# spot-sim-protocol §1
V100_ZONES = ["us-east-1c", "us-east-2b", "us-west-2a"]
V100_STARTS = [3318, 5530, 7742, 8848, 15484]
JOB_HOURS, DEADLINE_HOURS, RESTART_HOURS, CHECKPOINT_GB = 39.93889, 59.90833, 0.2, 50.0
ZONES_600S = ["us-east-1f", "us-east-2a", "us-west-2c"]
ARMS = ("optimal", "up-s", "up", "greedy", "spotbroker", "skynomad")


def _need(directory: Path) -> Path:
    if not directory.is_dir():
        pytest.fail(f"bundled traces missing: expected {directory} (they ship with the repository)")
    return directory


@pytest.fixture(scope="session")
def v100() -> TraceSet:
    return load_traces(_need(V100_DIR), V100_ZONES)


@pytest.fixture(scope="session")
def v100_600s() -> TraceSet:
    return load_traces(_need(V100_600S_DIR), ZONES_600S)


@pytest.fixture(scope="session")
def job():
    return job_from_hours(JOB_HOURS, DEADLINE_HOURS, RESTART_HOURS, CHECKPOINT_GB)


def starts_600s(traces: TraceSet, job) -> list[int]:
    """Sequential tiles of the 600 s set, as §1 tiles the V100 one."""
    L = job.window_ticks(traces.gap_s)
    return [L * w for w in range((traces.n_ticks - 1) // L)]


@pytest.fixture(scope="session")
def protocol_runs(v100, job) -> dict[str, list[WindowRun]]:
    """Every arm on the five V100 windows, computed once."""
    return {arm: run_arm(arm, v100, job, V100_STARTS) for arm in ARMS}


@pytest.fixture(scope="session")
def runs_600s(v100_600s, job) -> dict[str, list[WindowRun]]:
    starts = starts_600s(v100_600s, job)
    return {arm: run_arm(arm, v100_600s, job, starts) for arm in ARMS}
