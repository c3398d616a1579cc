"""Azure Scheduled Events: a ``Preempt`` (or ``Terminate``) event naming this
VM; :meth:`AzureWatcher.acknowledge` POSTs ``StartRequests`` once the flush
is committed."""
from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from spotbroker.agent.notices.watcher import (
    PREEMPTION,
    MetadataError,
    Notice,
    WatchConfig,
    Watcher,
    json_object,
    log,
)

AZURE_EVENTS_PATH = "/metadata/scheduledevents"
AZURE_EVENTS_VERSION = "2020-07-01"
AZURE_COMPUTE_PATH = "/metadata/instance/compute"
AZURE_COMPUTE_VERSION = "2021-02-01"
AZURE_HEADERS = {"Metadata": "true"}
AZURE_ENDING_EVENTS = frozenset({"Preempt", "Terminate"})


class AzureWatcher(Watcher):
    """Polls Scheduled Events for a Preempt/Terminate event naming this VM."""

    cloud = "azure"
    name = "azure.scheduled-events"

    def __init__(self, base_url: str, on_notice: Callable[[Notice], None], config: WatchConfig,
                 vm_name: str | None = None) -> None:
        super().__init__(base_url, on_notice, config)
        self.vm_name = vm_name
        self.incarnation: int | None = None
        self.acknowledged: list[str] = []

    def poll(self) -> list[Notice]:
        if self.vm_name is None:
            self.vm_name = self._fetch_vm_name()
        # The service starts on demand: the first call may take up to two minutes.
        timeout = self.config.request_timeout if self.polls else max(self.config.request_timeout,
                                                                     self.config.azure_first_timeout)
        answer = self.client.get(AZURE_EVENTS_PATH, params={"api-version": AZURE_EVENTS_VERSION},
                                 headers=AZURE_HEADERS, timeout=timeout)
        if answer.status_code != 200:
            raise MetadataError(f"{AZURE_EVENTS_PATH}: HTTP {answer.status_code}")
        document = json_object(answer, AZURE_EVENTS_PATH)
        incarnation, events = document.get("DocumentIncarnation"), document.get("Events")
        if not isinstance(incarnation, int) or not isinstance(events, list):
            raise MetadataError(f"{AZURE_EVENTS_PATH}: not a Scheduled Events document")
        self.incarnation = incarnation
        return [n for n in (self._interpret(e) for e in events) if n is not None]

    def _interpret(self, event: Any) -> Notice | None:
        if not isinstance(event, dict) or event.get("EventType") not in AZURE_ENDING_EVENTS:
            return None
        resources = event.get("Resources") or []
        if self.vm_name not in resources:
            return None  # an event for another VM of the same availability set
        event_id = event.get("EventId")
        if not isinstance(event_id, str) or not event_id:
            raise MetadataError(f"{AZURE_EVENTS_PATH}: event without an EventId")
        now = datetime.now(UTC)
        deadline = now + timedelta(seconds=self.config.azure_default_window)
        if event.get("NotBefore"):
            try:
                deadline = parsedate_to_datetime(event["NotBefore"])
            except (TypeError, ValueError) as exc:
                raise MetadataError(f"{AZURE_EVENTS_PATH}: bad NotBefore") from exc
        return Notice("azure", self.name, PREEMPTION, deadline, event, now, event_id)

    def acknowledge(self, event_id: str, attempts: int = 3) -> bool:
        """Tell Azure to go ahead (POST StartRequests); a few jittered retries."""
        body = {"StartRequests": [{"EventId": event_id}]}
        for attempt in range(1, attempts + 1):
            try:
                answer = self.client.post(AZURE_EVENTS_PATH, params={"api-version": AZURE_EVENTS_VERSION},
                                          headers=AZURE_HEADERS, json=body)
                if answer.status_code == 200:
                    self.acknowledged.append(event_id)
                    log.info("%s: acknowledged event %s", self.name, event_id)
                    return True
                log.warning("%s: acknowledging %s: HTTP %d", self.name, event_id, answer.status_code)
            except httpx.HTTPError as exc:
                log.warning("%s: acknowledging %s: %s", self.name, event_id, type(exc).__name__)
            if attempt < attempts:
                time.sleep(self._backoff(attempt))
        return False

    def _fetch_vm_name(self) -> str:
        answer = self.client.get(AZURE_COMPUTE_PATH, params={"api-version": AZURE_COMPUTE_VERSION},
                                 headers=AZURE_HEADERS)
        if answer.status_code != 200:
            raise MetadataError(f"{AZURE_COMPUTE_PATH}: HTTP {answer.status_code}")
        name = json_object(answer, AZURE_COMPUTE_PATH).get("name")
        if not isinstance(name, str) or not name:
            raise MetadataError(f"{AZURE_COMPUTE_PATH}: no VM name")
        return name


def probe(client: httpx.Client) -> bool:
    answer = client.get(AZURE_COMPUTE_PATH, params={"api-version": AZURE_COMPUTE_VERSION}, headers=AZURE_HEADERS)
    return answer.status_code == 200 and "name" in json_object(answer, AZURE_COMPUTE_PATH)
