"""Azure's Scheduled Events at ``/metadata/scheduledevents?api-version=...``:
``Metadata: true`` required (400 without); a ``Preempt`` event appears with
its ``NotBefore``; ``DocumentIncarnation`` grows on every change; a ``POST``
of ``StartRequests`` acknowledges an event, which then starts. Also
``/metadata/instance`` and its ``compute`` part."""
from __future__ import annotations

import email.utils
import json
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from spotbroker.agent.metadata_sim.server import Reply, json_reply

if TYPE_CHECKING:
    from spotbroker.agent.metadata_sim.instance import MetadataSimulator

EVENTS_API_VERSIONS = frozenset({"2017-03-01", "2017-11-01", "2019-01-01", "2019-08-01", "2020-07-01"})


def rfc1123(at: datetime) -> str:
    """Azure's NotBefore: `Sat, 21 Nov 2026 00:50:02 GMT`."""
    return email.utils.format_datetime(at.astimezone(UTC), usegmt=True)


def preempt_event(vm_name: str, not_before: datetime) -> dict[str, Any]:
    return {
        "EventId": str(uuid.uuid4()).upper(),
        "EventType": "Preempt",
        "ResourceType": "VirtualMachine",
        "Resources": [vm_name],
        "EventStatus": "Scheduled",
        "NotBefore": rfc1123(not_before),
        "Description": "The Spot Virtual Machine is being evicted.",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


def start_scheduled(sim: MetadataSimulator) -> None:
    """At the hard stop: Azure starts a Preempt event at NotBefore whether or not
    it was acknowledged. The caller holds ``sim.changed``."""
    for event in sim.azure_events:
        if event["EventStatus"] == "Scheduled":
            event["EventStatus"] = "Started"
            sim.incarnation += 1


def handle(sim: MetadataSimulator, method: str, path: str, query: dict[str, str], headers: dict[str, str],
           body: bytes) -> Reply:
    if not path.startswith("/metadata/"):
        return Reply(404, b"Not Found\n")
    if "x-forwarded-for" in headers or headers.get("metadata", "").lower() != "true":
        return _error(400, "Bad request. Required metadata header not specified")
    version = query.get("api-version")
    if not version:
        return _error(400, "Bad request. api-version was not specified in the request")
    if path == "/metadata/scheduledevents":
        if version not in EVENTS_API_VERSIONS:
            return _error(400, "Bad request. api-version is invalid or was not specified in the request")
        if method == "GET":
            return _events_document(sim)
        if method == "POST":
            return _ack(sim, body)
        return _error(405, "Method not allowed")
    if method != "GET":
        return _error(405, "Method not allowed")
    compute = _compute(sim)
    if path == "/metadata/instance/compute":
        return json_reply(compute)
    if path == "/metadata/instance":
        return json_reply({"compute": compute, "network": {"interface": []}})
    return _error(404, "Not found")


def _error(status: int, message: str) -> Reply:
    return json_reply({"error": message}, status)


def _events_document(sim: MetadataSimulator) -> Reply:
    with sim.changed:
        document = {"DocumentIncarnation": sim.incarnation, "Events": [dict(e) for e in sim.azure_events]}
    return json_reply(document)


def _ack(sim: MetadataSimulator, body: bytes) -> Reply:
    try:
        requests = json.loads(body or b"{}")["StartRequests"]
        ids = [str(r["EventId"]) for r in requests]
    except (ValueError, KeyError, TypeError):
        return _error(400, "Bad request. Body must be {\"StartRequests\": [{\"EventId\": ...}]}")
    with sim.changed:
        known = {e["EventId"]: e for e in sim.azure_events}
        unknown = [i for i in ids if i not in known]
        if unknown:
            return _error(400, f"Bad request. Unknown EventId {unknown[0]}")
        for event_id in ids:
            sim.acknowledged.append(event_id)
            if known[event_id]["EventStatus"] == "Scheduled":
                known[event_id]["EventStatus"] = "Started"  # approved: the platform goes ahead
                sim.incarnation += 1
        sim.changed.notify_all()
    return Reply(200, b"", "application/json")


def _compute(sim: MetadataSimulator) -> dict[str, Any]:
    return {
        "name": sim.vm_name,
        "vmId": "8d2b7c5e-0b4f-4e8a-9d0c-2b1f6c3e7a10",
        "location": "eastus",
        "zone": sim.zone,
        "vmSize": "Standard_NC24ads_A100_v4",
        "priority": "Spot",
        "evictionPolicy": "Delete",
        "resourceGroupName": "spotbroker",
        "subscriptionId": "00000000-0000-0000-0000-000000000000",
    }
