"""GCP: ``instance/preempted`` and ``instance/maintenance-event``, long-polled
with ``wait_for_change=true`` and the last ETag."""
from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx

from spotbroker.agent.notices.watcher import (
    MAINTENANCE,
    PREEMPTION,
    MetadataError,
    Notice,
    WatchConfig,
    Watcher,
)

log = logging.getLogger("spotbroker.agent.notices")

GCP_PREFIX = "/computeMetadata/v1/"
GCP_HEADERS = {"Metadata-Flavor": "Google"}
GCP_MAINTENANCE_VALUES = frozenset({"NONE", "MIGRATE_ON_HOST_MAINTENANCE", "TERMINATE_ON_HOST_MAINTENANCE"})


class GcpWatcher(Watcher):
    """Long-polls one metadata key with wait_for_change and the last ETag."""

    cloud = "gcp"

    def __init__(self, key: str, base_url: str, on_notice: Callable[[Notice], None], config: WatchConfig) -> None:
        super().__init__(base_url, on_notice, config)
        self.key = key
        self.name = "gcp." + key.rsplit("/", 1)[-1]
        self.etag: str | None = None
        self._long_polled = False

    def poll(self) -> list[Notice]:
        path = GCP_PREFIX + self.key
        if self.etag is None:  # learn the current value and its ETag first
            answer = self.client.get(path, headers=GCP_HEADERS)
            self._long_polled = False
        else:
            wait = self.config.gcp_long_poll
            params = {"wait_for_change": "true", "last_etag": self.etag, "timeout_sec": str(wait)}
            answer = self.client.get(path, params=params, headers=GCP_HEADERS,
                                     timeout=wait + self.config.request_timeout)
            self._long_polled = True
        if answer.status_code != 200:
            raise MetadataError(f"{path}: HTTP {answer.status_code}")
        etag = answer.headers.get("ETag")
        value = answer.text.strip()
        if not etag:
            raise MetadataError(f"{path}: answer without an ETag")
        notice = self._interpret(value)
        self.etag = etag
        return [notice] if notice else []

    def next_delay(self) -> float:
        # After a long poll returned, ask again at once: the server does the waiting.
        return 0.0 if self._long_polled else self.config.poll_interval

    def _interpret(self, value: str) -> Notice | None:
        now = datetime.now(UTC)
        if self.key == "instance/preempted":
            if value not in ("TRUE", "FALSE"):
                raise MetadataError(f"{self.key}: unexpected value ({len(value)} chars)")
            if value == "FALSE":
                self.forget_seen()
                return None
            window = self.config.gcp_preempt_window
            return Notice("gcp", self.name, PREEMPTION, now + timedelta(seconds=window), value, now)
        if value not in GCP_MAINTENANCE_VALUES:
            raise MetadataError(f"{self.key}: unexpected value ({len(value)} chars)")
        if not value.startswith("TERMINATE"):
            if value == "NONE":
                self.forget_seen()
            else:
                log.info("%s: %s (the VM is migrated, not stopped)", self.name, value)
            return None
        window = self.config.gcp_maintenance_window
        return Notice("gcp", self.name, MAINTENANCE, now + timedelta(seconds=window), value, now)


def probe(client: httpx.Client) -> bool:
    return client.get("/", headers=GCP_HEADERS).headers.get("Metadata-Flavor") == "Google"
