"""The power a node draws at the wall, estimated (kW).

GPUs at their board power (a training run keeps them near it), each vCPU at
the midpoint of the cloud's per-vCPU minimum and maximum watts, memory per
GiB, all times the provider's PUE. data/README.md gives the sources. A node
whose agent reads NVML reports measured GPU energy instead; `estimate`
says which parts are rated figures so the job can tell the user.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from importlib import resources

# Per-vCPU watts at 0 % and 100 % utilisation, and the PUE, as Cloud Carbon
# Footprint tabulates them (its methodology, Appendix I).
_VCPU_WATTS = {"aws": (0.74, 3.5), "gcp": (0.71, 4.26), "azure": (0.78, 3.76)}
PUE = {"aws": 1.135, "gcp": 1.1, "azure": 1.185}
_DEFAULT_PUE = 1.2  # a cloud not above (Kubernetes, the local launcher): a typical hyperscale figure
MEMORY_WATTS_PER_GIB = 0.392
UNKNOWN_GPU_WATTS = 300.0


@dataclass(frozen=True)
class Power:
    kw: float          # at the wall, PUE included, per node
    gpu_watts: float   # per GPU, rated
    basis: str         # how it was estimated, for the job and the docs


@cache
def _gpu_watts() -> dict[str, tuple[float, str]]:
    path = resources.files("spotbroker.broker.energy").joinpath("data", "accelerator_power.csv")
    with path.open(encoding="utf-8") as f:
        return {r["accelerator"].lower(): (float(r["watts_per_gpu"]), r["source"]) for r in csv.DictReader(f)}


def gpu_watts(accelerator: str | None) -> tuple[float, str]:
    """(watts per GPU, source) for an accelerator name as the catalog spells it."""
    if not accelerator:
        return 0.0, "no GPU"
    return _gpu_watts().get(accelerator.lower(), (UNKNOWN_GPU_WATTS, f"{accelerator} not in the table: "
                                                                     f"{UNKNOWN_GPU_WATTS:.0f} W assumed"))


def pue(cloud: str) -> float:
    return PUE.get(cloud, _DEFAULT_PUE)


def estimate(cloud: str, accelerator: str | None, gpus: float, vcpus: float | None,
             memory_gib: float | None) -> Power:
    """One node's power at the wall: rated GPUs plus CPU and memory, times PUE."""
    per_gpu, source = gpu_watts(accelerator)
    low, high = _VCPU_WATTS.get(cloud, (0.75, 3.75))
    cpu = (vcpus or 0) * (low + high) / 2
    memory = (memory_gib or 0) * MEMORY_WATTS_PER_GIB
    watts = per_gpu * (gpus or 0) + cpu + memory
    basis = (f"estimated: {gpus or 0:g} × {per_gpu:.0f} W GPU ({source}) + {vcpus or 0:g} vCPU × "
             f"{(low + high) / 2:.2f} W + {memory_gib or 0:g} GiB × {MEMORY_WATTS_PER_GIB} W, × PUE {pue(cloud)}")
    return Power(kw=watts * pue(cloud) / 1000, gpu_watts=per_gpu, basis=basis)


def measured_kw(gpu_joules: float, seconds: float, cloud: str, vcpus: float | None, memory_gib: float | None) -> float:
    """Average wall power over `seconds` from the GPUs' measured energy plus
    the estimated CPU and memory share, times PUE (what a measured attempt
    reports)."""
    if seconds <= 0:
        return 0.0
    low, high = _VCPU_WATTS.get(cloud, (0.75, 3.75))
    rest = (vcpus or 0) * (low + high) / 2 + (memory_gib or 0) * MEMORY_WATTS_PER_GIB
    return (gpu_joules / seconds + rest) * pue(cloud) / 1000
