"""GCP's metadata server: everything under ``/computeMetadata/v1/`` needs
``Metadata-Flavor: Google``; ``instance/preempted`` turns from ``FALSE`` to
``TRUE`` and ``instance/maintenance-event`` from ``NONE``; answers carry an
``ETag``, and ``?wait_for_change=true&last_etag=...&timeout_sec=...``
long-polls until the value changes."""
from __future__ import annotations

import hashlib
import time
from typing import TYPE_CHECKING

from spotbroker.agent.metadata_sim.server import HANG_LIMIT_S, Reply

if TYPE_CHECKING:
    from spotbroker.agent.metadata_sim.instance import MetadataSimulator

# GCP warns of host maintenance on GPU VMs 60 s ahead.
MAINTENANCE_WINDOW = 60.0
PREFIX = "/computeMetadata/v1/"


def etag(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def handle(sim: MetadataSimulator, method: str, path: str, query: dict[str, str], headers: dict[str, str]) -> Reply:
    flavor = {"Metadata-Flavor": "Google"}
    if path == "/":  # the root answers anyone, with the flavor header (used for detection)
        return Reply(200, b"computeMetadata/\n", headers=flavor)
    if not path.startswith(PREFIX):
        return Reply(404, b"Not Found\n", headers=flavor)
    if "x-forwarded-for" in headers or headers.get("metadata-flavor") != "Google":
        return Reply(403, b"Missing Metadata-Flavor:Google header.\n", headers=flavor)
    if method != "GET":
        return Reply(405, b"Method Not Allowed\n", headers=flavor)
    key = path[len(PREFIX):]
    value = _value(sim, key)
    if value is None:
        return Reply(404, b"Not Found\n", headers=flavor)
    if query.get("wait_for_change", "").lower() == "true":
        value = _wait(sim, key, value, query)
    return Reply(200, value.encode(), "application/text", {**flavor, "ETag": etag(value)})


def _value(sim: MetadataSimulator, key: str) -> str | None:
    with sim.changed:
        preempted = sim.deadline is not None
        maintenance = sim.maintenance_event
    values = {
        "instance/preempted": "TRUE" if preempted else "FALSE",
        "instance/maintenance-event": maintenance,
        "instance/id": "4520031799277581759",
        "instance/name": sim.vm_name,
        "instance/hostname": f"{sim.vm_name}.c.spotbroker-test.internal",
        "instance/zone": f"projects/123456789012/zones/{sim.zone}",
        "instance/machine-type": "projects/123456789012/machineTypes/a2-highgpu-1g",
        "instance/scheduling/provisioning-model": "SPOT",
        "project/project-id": "spotbroker-test",
    }
    return values.get(key)


def _wait(sim: MetadataSimulator, key: str, value: str, query: dict[str, str]) -> str:
    """Block until the value's ETag differs from `last_etag` (or the current one), or timeout_sec."""
    last = query.get("last_etag") or etag(value)
    try:
        timeout = float(query.get("timeout_sec", HANG_LIMIT_S))
    except ValueError:
        timeout = HANG_LIMIT_S
    end = time.monotonic() + max(0.0, timeout)
    with sim.changed:
        while True:
            current = _value(sim, key) or ""
            remaining = end - time.monotonic()
            if etag(current) != last or remaining <= 0 or sim.stopping.is_set():
                return current
            sim.changed.wait(remaining)
