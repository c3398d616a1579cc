"""Preemption-notice watchers: one small monitor per source, in its own thread.

Modelled on the AWS Node Termination Handler: each source is polled on its
own short ticker with short timeouts; failures (garbage, 5xx, hangs,
refused connections) are logged and retried with jittered exponential
back-off, never raised; an event is reported once (de-duplicated by its
content, or by Azure's EventId).

Sources:

* AWS IMDSv2 — `spot/instance-action` (the 2-minute notice) and
  `events/recommendations/rebalance`; one session token shared by both,
  refreshed before it expires and fetched again on a 401; 404 = nothing yet.
* GCP — `instance/preempted` and `instance/maintenance-event`, long-polled
  with `wait_for_change=true` and the last ETag.
* Azure Scheduled Events — a `Preempt` (or `Terminate`) event for this VM;
  `Watchers.acknowledge()` POSTs `StartRequests` once the flush is committed.

The base URL of every source is configurable (`SPOTBROKER_METADATA_URL`), so
`spotbroker.agent.simulator` can stand in for the cloud.
"""
from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
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

log = logging.getLogger(__name__)

CLOUDS = ("aws", "gcp", "azure")
DEFAULT_METADATA_URLS = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}

# Notice kinds (Notice.kind); all but REBALANCE end the node.
PREEMPTION = "preemption"
MAINTENANCE = "maintenance"
REBALANCE = "rebalance"
DRAIN = DRAIN_KIND  # not a cloud's: the broker moves the attempt elsewhere ("drain")

AWS_TOKEN_PATH = "/latest/api/token"
AWS_TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
AWS_TOKEN_HEADER = "X-aws-ec2-metadata-token"
AWS_INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
AWS_REBALANCE = "/latest/meta-data/events/recommendations/rebalance"
AWS_ACTIONS = frozenset({"terminate", "stop", "hibernate"})

GCP_PREFIX = "/computeMetadata/v1/"
GCP_HEADERS = {"Metadata-Flavor": "Google"}
GCP_MAINTENANCE_VALUES = frozenset({"NONE", "MIGRATE_ON_HOST_MAINTENANCE", "TERMINATE_ON_HOST_MAINTENANCE"})

AZURE_EVENTS_PATH = "/metadata/scheduledevents"
AZURE_EVENTS_VERSION = "2020-07-01"
AZURE_COMPUTE_PATH = "/metadata/instance/compute"
AZURE_COMPUTE_VERSION = "2021-02-01"
AZURE_HEADERS = {"Metadata": "true"}
AZURE_ENDING_EVENTS = frozenset({"Preempt", "Terminate"})


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


def _client(base_url: str, timeout: float) -> httpx.Client:
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
        self.client = _client(base_url, config.request_timeout)
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


# --- AWS IMDSv2 ---------------------------------------------------------------


class ImdsToken:
    """One IMDSv2 session token, shared by the AWS watchers; refreshed before expiry."""

    def __init__(self, base_url: str, config: WatchConfig) -> None:
        self.config = config
        self.fetches = 0
        self._client = _client(base_url, config.request_timeout)
        self._lock = threading.Lock()
        self._token: str | None = None
        self._expires = 0.0  # monotonic

    def get(self) -> str:
        with self._lock:
            if self._token is None or time.monotonic() >= self._expires - self._margin():
                self._token, self._expires = self._fetch()
            return self._token

    def invalidate(self, token: str) -> None:
        """Drop `token` after a 401 (unless another thread already replaced it)."""
        with self._lock:
            if self._token == token:
                self._token = None

    def close(self) -> None:
        self._client.close()

    def _margin(self) -> float:
        # A short TTL (tests) must still leave the token some life before a refresh.
        return min(self.config.aws_token_margin, self.config.aws_token_ttl / 4)

    def _fetch(self) -> tuple[str, float]:
        ttl = self.config.aws_token_ttl
        started = time.monotonic()
        answer = self._client.put(AWS_TOKEN_PATH, headers={AWS_TOKEN_TTL_HEADER: str(ttl)})
        if answer.status_code != 200:
            raise MetadataError(f"IMDSv2 token request: HTTP {answer.status_code}")
        token = answer.text.strip()
        # The body is a secret: check it, never log it.
        if not token or len(token) > 512 or not (token.isascii() and token.isprintable()) or " " in token:
            raise MetadataError(f"IMDSv2 token request: unusable token ({len(answer.content)} bytes)")
        granted = answer.headers.get(AWS_TOKEN_TTL_HEADER, str(ttl))
        try:
            ttl = int(granted)
        except ValueError:
            pass
        self.fetches += 1
        return token, started + ttl


class AwsWatcher(Watcher):
    """Polls one IMDSv2 path; 404 means nothing yet."""

    cloud = "aws"

    def __init__(self, path: str, token: ImdsToken, base_url: str,
                 on_notice: Callable[[Notice], None], config: WatchConfig) -> None:
        super().__init__(base_url, on_notice, config)
        self.path = path
        self.token = token
        self.name = "aws." + ("instance-action" if path == AWS_INSTANCE_ACTION else "rebalance")

    def poll(self) -> list[Notice]:
        answer = self._get()
        if answer.status_code == 404:
            return []
        if answer.status_code != 200:
            raise MetadataError(f"{self.path}: HTTP {answer.status_code}")
        payload = _json_object(answer, self.path)
        if self.path == AWS_INSTANCE_ACTION:
            return [self._instance_action(payload)]
        return [self._rebalance(payload)]

    def _get(self) -> httpx.Response:
        token = self.token.get()
        answer = self.client.get(self.path, headers={AWS_TOKEN_HEADER: token})
        if answer.status_code == 401:  # expired or revoked early: one fresh token, one retry
            self.token.invalidate(token)
            answer = self.client.get(self.path, headers={AWS_TOKEN_HEADER: self.token.get()})
        return answer

    def _instance_action(self, payload: dict[str, Any]) -> Notice:
        action = payload.get("action")
        if action not in AWS_ACTIONS:
            raise MetadataError(f"{self.path}: unknown action {action!r}")
        return Notice("aws", self.name, PREEMPTION, _parse_iso(payload.get("time"), self.path), payload)

    def _rebalance(self, payload: dict[str, Any]) -> Notice:
        _parse_iso(payload.get("noticeTime"), self.path)  # validates the shape
        return Notice("aws", self.name, REBALANCE, None, payload)


# --- GCP ------------------------------------------------------------------------


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


# --- Azure ------------------------------------------------------------------------


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
        document = _json_object(answer, AZURE_EVENTS_PATH)
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
        name = _json_object(answer, AZURE_COMPUTE_PATH).get("name")
        if not isinstance(name, str) or not name:
            raise MetadataError(f"{AZURE_COMPUTE_PATH}: no VM name")
        return name


# --- a cloud's set of watchers ---------------------------------------------------


class Watchers:
    """All the watchers of one cloud, started and stopped together."""

    def __init__(self, cloud: str, watchers: list[Watcher], token: ImdsToken | None = None) -> None:
        self.cloud = cloud
        self.watchers = watchers
        self._token = token

    def start(self) -> None:
        for watcher in self.watchers:
            watcher.start()

    def stop(self) -> None:
        for watcher in self.watchers:
            watcher.request_stop()  # all at once; a thread in a long poll ends on its own (daemon)
        for watcher in self.watchers:
            watcher.stop(join_timeout=0.05)
        if self._token is not None:
            self._token.close()

    def acknowledge(self, notice: Notice) -> bool:
        """Acknowledge a notice where the cloud wants it (Azure); False where none is needed."""
        for watcher in self.watchers:
            if isinstance(watcher, AzureWatcher) and notice.event_id and notice.source == watcher.name:
                return watcher.acknowledge(notice.event_id)
        return False


def build_watchers(cloud: str, on_notice: Callable[[Notice], None], base_url: str | None = None,
                   config: WatchConfig | None = None, azure_vm_name: str | None = None) -> Watchers:
    """The watchers of `cloud` against `base_url` (default: the cloud's own endpoint)."""
    config = config or WatchConfig()
    url = (base_url or DEFAULT_METADATA_URLS[cloud]).rstrip("/")
    if cloud == "aws":
        token = ImdsToken(url, config)
        paths = (AWS_INSTANCE_ACTION, AWS_REBALANCE)
        return Watchers(cloud, [AwsWatcher(p, token, url, on_notice, config) for p in paths], token)
    if cloud == "gcp":
        keys = ("instance/preempted", "instance/maintenance-event")
        return Watchers(cloud, [GcpWatcher(k, url, on_notice, config) for k in keys])
    if cloud == "azure":
        return Watchers(cloud, [AzureWatcher(url, on_notice, config, azure_vm_name)])
    raise ValueError(f"no notice watchers for cloud {cloud!r} (one of {', '.join(CLOUDS)})")


# --- cloud detection ---------------------------------------------------------------


def _probe_aws(client: httpx.Client) -> bool:
    answer = client.put(AWS_TOKEN_PATH, headers={AWS_TOKEN_TTL_HEADER: "60"})
    return answer.status_code == 200 and bool(answer.text.strip())


def _probe_gcp(client: httpx.Client) -> bool:
    return client.get("/", headers=GCP_HEADERS).headers.get("Metadata-Flavor") == "Google"


def _probe_azure(client: httpx.Client) -> bool:
    answer = client.get(AZURE_COMPUTE_PATH, params={"api-version": AZURE_COMPUTE_VERSION}, headers=AZURE_HEADERS)
    return answer.status_code == 200 and "name" in _json_object(answer, AZURE_COMPUTE_PATH)


_PROBES: dict[str, Callable[[httpx.Client], bool]] = {"aws": _probe_aws, "gcp": _probe_gcp, "azure": _probe_azure}


def detect_cloud(metadata_url: str | None = None, timeout: float = 1.0) -> str | None:
    """Which cloud's metadata service answers (all probed at once); None off-cloud."""

    def probe(cloud: str) -> bool:
        try:
            with _client(metadata_url or DEFAULT_METADATA_URLS[cloud], timeout) as client:
                return _PROBES[cloud](client)
        except (httpx.HTTPError, MetadataError, ValueError):
            return False

    with ThreadPoolExecutor(max_workers=len(CLOUDS), thread_name_prefix="detect-cloud") as pool:
        found = dict(zip(CLOUDS, pool.map(probe, CLOUDS)))
    return next((cloud for cloud in CLOUDS if found[cloud]), None)


def resolve_cloud(setting: str | None, metadata_url: str | None, timeout: float = 1.0) -> str | None:
    """The cloud to watch: as set (`SPOTBROKER_CLOUD`), else detected.

    `local` means no cloud metadata service, unless a metadata URL is given (the
    local launcher's simulator), in which case the simulated cloud is detected.
    """
    setting = (setting or "").strip().lower()
    if setting in CLOUDS:
        return setting
    if setting == "local" and not metadata_url:
        return None
    if setting not in ("", "local"):
        raise ValueError(f"unknown cloud {setting!r}: use aws, gcp, azure or local")
    return detect_cloud(metadata_url, timeout)


# --- helpers ---------------------------------------------------------------------


def _json_object(answer: httpx.Response, what: str) -> dict[str, Any]:
    try:
        payload = answer.json()
    except ValueError as exc:
        raise MetadataError(f"{what}: unparseable payload ({len(answer.content)} bytes)") from exc
    if not isinstance(payload, dict):
        raise MetadataError(f"{what}: expected a JSON object")
    return payload


def _parse_iso(value: Any, what: str) -> datetime:
    if not isinstance(value, str):
        raise MetadataError(f"{what}: missing time")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise MetadataError(f"{what}: bad time {value!r}") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
