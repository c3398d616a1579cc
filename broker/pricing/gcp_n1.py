"""GCP's GPUs that attach to a general-purpose N1 machine (T4, V100, P100,
P4), where the A2, A3, A4 and G2 machine types come with their GPUs.

An offer of one is the pair, named `n1-highmem-4+T4:1` (the machine type,
then the GPUs as a task names them), so that an offer's key (cloud, zone,
instance type) stays one thing to rent: the same N1 size carries a T4 in one
offer and two in another. `machine_type` gives the cloud's name back (what
SkyPilot launches, with the GPUs beside it).

Which sizes go with which GPUs: GCP's limits per GPU count (the most vCPUs
and memory a machine with them may have; cloud.google.com/compute/docs/gpus),
and at least the vCPUs SkyPilot gives such a task that names none, with 4 GiB
of memory per vCPU of those. So a job that names no cpus is placed on the
machine SkyPilot would have chosen, not on a 1-vCPU host; a job that names
fewer cpus than that finds no N1 offer.
"""
from __future__ import annotations

SERIES = "n1"
# GPU -> count -> (least vCPUs, most vCPUs, most GiB of memory)
SIZES: dict[str, dict[int, tuple[int, int, int]]] = {
    "T4": {1: (4, 48, 312), 2: (8, 48, 312), 4: (48, 96, 624)},
    "V100": {1: (8, 12, 78), 2: (16, 24, 156), 4: (32, 48, 312), 8: (64, 96, 624)},
    "P100": {1: (8, 16, 104), 2: (16, 32, 208), 4: (32, 96, 624)},
    "P4": {1: (8, 24, 156), 2: (16, 48, 312), 4: (32, 96, 624)},
}
GIB_PER_VCPU = 4


def is_host(machine_type: str) -> bool:
    return machine_type.startswith(SERIES + "-")


def fits(gpu: str, count: int, vcpus: float, memory_gib: float) -> bool:
    """An N1 machine of this size may carry `count` of `gpu`, and is one a task naming no cpus would get."""
    least, most, most_gib = SIZES.get(gpu, {}).get(count, (0, 0, 0))
    return bool(most) and least <= vcpus <= most and GIB_PER_VCPU * least <= memory_gib <= most_gib


def shapes(gpu: str) -> list[int]:
    """The counts of `gpu` an N1 machine carries ([] for a GPU that never attaches to one)."""
    return sorted(SIZES.get(gpu, {}))


def offer_type(machine_type: str, gpu: str, count: int) -> str:
    return f"{machine_type}+{gpu}:{count}"


def machine_type(instance_type: str) -> str:
    """The cloud's machine type of an offer's instance type (`n1-highmem-4+T4:1` -> `n1-highmem-4`)."""
    return instance_type.partition("+")[0]
