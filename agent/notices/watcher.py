"""What every notice watcher shares: the :class:`Notice`, the timing
(:class:`WatchConfig`), and the :class:`Watcher` thread that polls one source,
backs off on failures and reports each new notice once."""
from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from spotbroker.agent.backoff import jittered_backoff
from spotbroker.agent.protocol import (
    DRAIN_CLOUD,
    DRAIN_KIND,
    DRAIN_SOURCE,
    PREEMPTION_NOTICE,
    REBALANCE_RECOMMENDATION,
)

log = logging.getLogger("spotbroker.agent.notices")

# Notice kinds (Notice.kind); all but REBALANCE end the node.
PREEMPTION = "preemption"
MAINTENANCE = "maintenance"
REBALANCE = "rebalance"
DRAIN = DRAIN_KIND  # not a cloud's: the broker moves the attempt elsewhere ("drain")


class MetadataError(Exception):
    """The metadata service answered something we cannot use (logged, retried)."""


@dataclass(frozen=True)
class WatchConfig:
    """Timing of the watchers. Defaults follow the clouds' advice; tests shrink them."""

    poll_interval: float = 1.0          # AWS: poll <= 5 s (NTH: 2 s); Azure: once a second
    request_timeout: float = 2.0        # short: a hung metadata service must not stall a watcher
    backoff_initial: float = 0.5
    backoff_max: float = 5.0            # small beside the windows (30 s): a flaky service must not hide a notice
    aws_token_ttl: int = 3600           # seconds requested for an IMDSv2 token
    aws_token_margin: float = 15.0      # refresh this long before the token expires (as NTH)
    gcp_long_poll: int = 60             # timeout_sec of a wait_for_change request
    gcp_preempt_window: float = 30.0    # GCP gives no time: ACPI soft-off -> hard-off is 30 s
    gcp_maintenance_window: float = 60.0
    azure_first_timeout: float = 120.0  # the first Scheduled Events call may take ~2 min
    azure_default_window: float = 30.0  # when an event carries no NotBefore


@dataclass(frozen=True)
class Notice:
    """One event seen at a metadata service."""

    cloud: str
    source: str            # which watcher saw it, e.g. "aws.instance-action"
    kind: str              # PREEMPTION, MAINTENANCE, REBALANCE or DRAIN
    deadline: datetime | None  # the cloud's hard stop (None for a rebalance recommendation)
    raw: Any               # the payload as the cloud gave it
    observed_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    event_id: str | None = None  # Azure's EventId, needed to acknowledge

    @property
    def ends_node(self) -> bool:
        return self.kind != REBALANCE

    @property
    def event_type(self) -> str:
        return PREEMPTION_NOTICE if self.ends_node else REBALANCE_RECOMMENDATION

    def event_data(self) -> dict[str, Any]:
        """The `data` of the event reported to the broker."""
        return {
            "cloud": self.cloud,
            "kind": self.kind,
            "source": self.source,
            "deadline": self.deadline.isoformat() if self.deadline else None,
            "observed_at": self.observed_at.isoformat(),
            "raw": self.raw,
            **({"event_id": self.event_id} if self.event_id else {}),
        }

    def dedup_key(self) -> str:
        """Same source, same content: the same event (Azure: the same EventId)."""
        if self.event_id:
            return f"{self.source}:{self.event_id}"
        return f"{self.source}:{self.kind}:{json.dumps(self.raw, sort_keys=True, default=str)}"


def drain_notice(window: float) -> Notice:
    """The notice that stands for the broker's drain: it ends the node `window` seconds from now."""
    now = datetime.now(UTC)
    return Notice(DRAIN_CLOUD, DRAIN_SOURCE, DRAIN, now + timedelta(seconds=window), None, now)


def metadata_client(base_url: str, timeout: float) -> httpx.Client:
    # trust_env=False: a node's HTTP(S)_PROXY must never carry metadata requests.
    # verify=False: metadata services are plain HTTP, so skip loading a CA bundle per client.
    return httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout, trust_env=False, verify=False)


class Watcher:
    """A thread that polls one source and reports each new notice once."""

    name = "watcher"
    cloud = ""

    def __init__(self, base_url: str, on_notice: Callable[[Notice], None], config: WatchConfig) -> None:
        self.base_url = base_url
        self.on_notice = on_notice
        self.config = config
        self.client = metadata_client(base_url, config.request_timeout)
        self.failures = 0        # the current streak of failed polls
        self.polls = 0           # successful polls, for tests and logs
        self._seen: set[str] = set()
        self._stop = threading.Event()
        self._rng = random.Random()
        self._thread: threading.Thread | None = None

    # A subclass implements one poll: the notices now visible (may block up to a timeout).
    def poll(self) -> list[Notice]:
        raise NotImplementedError

    def next_delay(self) -> float:
        """Pause before the next poll after a successful one."""
        return self.config.poll_interval

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"notice-{self.name}", daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        self._stop.set()

    def stop(self, join_timeout: float = 1.0) -> None:
        self.request_stop()
        if self._thread is not None:
            self._thread.join(join_timeout)
        self.client.close()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                notices = self.poll()
            except Exception as exc:  # never crash: log, back off, keep watching
                if self._stop.is_set():
                    return
                self.failures += 1
                self._log_failure(exc)
                self._stop.wait(self._backoff(self.failures))
                continue
            if self.failures:
                log.info("%s: metadata service answers again after %d failed polls", self.name, self.failures)
            self.failures = 0
            self.polls += 1
            for notice in notices:
                self._emit(notice)
            self._stop.wait(self.next_delay())

    def _backoff(self, failures: int) -> float:
        return jittered_backoff(failures, self.config.backoff_initial, self.config.backoff_max, self._rng)

    def _log_failure(self, exc: Exception) -> None:
        # The first failure of a streak and every tenth: a dead service must not flood the log.
        level = logging.WARNING if self.failures == 1 or self.failures % 10 == 0 else logging.DEBUG
        log.log(level, "%s: poll failed (%d in a row), backing off: %s: %s",
                self.name, self.failures, type(exc).__name__, exc)

    def _emit(self, notice: Notice) -> None:
        key = notice.dedup_key()
        if key in self._seen:
            return
        self._seen.add(key)
        log.warning("%s: %s notice, deadline %s", self.name, notice.kind,
                    notice.deadline.isoformat() if notice.deadline else "none")
        try:
            self.on_notice(notice)
        except Exception:  # the receiver's bug must not stop the watching
            log.exception("%s: notice handler failed", self.name)

    def forget_seen(self) -> None:
        """The source went quiet again: a later identical event is a new one."""
        self._seen.clear()


def json_object(answer: httpx.Response, what: str) -> dict[str, Any]:
    try:
        payload = answer.json()
    except ValueError as exc:
        raise MetadataError(f"{what}: unparseable payload ({len(answer.content)} bytes)") from exc
    if not isinstance(payload, dict):
        raise MetadataError(f"{what}: expected a JSON object")
    return payload


def parse_iso(value: Any, what: str) -> datetime:
    if not isinstance(value, str):
        raise MetadataError(f"{what}: missing time")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise MetadataError(f"{what}: bad time {value!r}") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
