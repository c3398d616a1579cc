"""Delivery to the broker's agent channel.

Two threads, each with its own back-off, so that a stuck log upload never
holds back a preemption notice: the event sender posts the outbox's events in
seq order (POST /v1/agent/events), the log shipper sends the trainer's output
from the byte offset the broker has (POST /v1/agent/logs). When the trainer
is gone the supervisor tells both to finish, and they drain what is left:
through any outage, with capped and jittered back-off, until the broker has
every event and every byte (or until a deadline, if the agent was given one;
what is undelivered then stays on disk). A broker that answers 410 Gone has
ended the attempt for good: both stop at once, and the agent exits.
"""
from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotbroker.agent.backoff import jittered_backoff
from spotbroker.agent.outbox import Outbox
from spotbroker.agent.protocol import (
    ANSWER_CANCEL,
    ANSWER_CHECKPOINT_INTERVAL,
    ANSWER_DRAIN,
    ANSWER_DRAIN_SECONDS,
    ANSWER_STOP,
    CREDENTIALS_PATH,
    EVENT_NODE,
    EVENTS_PATH,
    LOG_NODE_HEADER,
    LOG_OFFSET_HEADER,
    LOGS_PATH,
    PREEMPTION_NOTICE,
)

if TYPE_CHECKING:
    import httpx

    from spotbroker.agent.config import RunnerConfig

log = logging.getLogger("spotbroker.agent")

LOG_CHUNK = 1 << 20  # the most log bytes sent in one request


class BrokerUnavailable(Exception):
    """Down, refusing, or failing: try again later."""


class BrokerRejected(Exception):
    """The broker says the request itself is wrong: retrying cannot help."""


class BrokerGone(Exception):
    """410: the attempt ended longer ago than the broker's grace window; it takes nothing more."""


def _tls_for(url: str) -> ssl.SSLContext | bool:
    """The CA bundle for an https broker. For a plain-HTTP one (a broker on
    the node's own network) a context that trusts nothing: no TLS is spoken
    (the client follows no redirects), and parsing the bundle costs ~20 ms
    of CPU for every job's agent."""
    if url.lower().startswith("https://"):
        return True
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies certificates and names, and trusts no issuer


class BrokerClient:
    """The agent channel over HTTP; a failed request is BrokerUnavailable (retry),
    BrokerRejected (give this request up) or BrokerGone (give everything up)."""

    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        import httpx  # here, not at the top: the trainer is already running when this loads

        self._httpx = httpx
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # trust_env=False: the agent starts with the job's `envs`, and a proxy
        # (or CA file) the job names there would carry, or read, its token.
        self._http: httpx.Client = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout,
                                                trust_env=False, verify=_tls_for(url))

    def post_events(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        answer = self._send(EVENTS_PATH, json={"events": events})
        return _json_or_empty(answer)

    def post_log(self, offset: int, chunk: bytes, node: int = 0) -> int:
        headers = {LOG_OFFSET_HEADER: str(offset), LOG_NODE_HEADER: str(node),
                   "Content-Type": "application/octet-stream"}
        size = _json_or_empty(self._send(LOGS_PATH, content=chunk, headers=headers)).get("size")
        if not isinstance(size, int):
            raise BrokerUnavailable("log answer without a size")
        return size

    def post_credentials(self) -> dict[str, Any]:
        """Fresh storage credentials for the attempt (agent/credentials.py)."""
        return _json_or_empty(self._send(CREDENTIALS_PATH))

    def close(self) -> None:
        self._http.close()

    def _send(self, path: str, **kwargs: Any) -> httpx.Response:
        try:
            answer = self._http.post(path, **kwargs)
        except self._httpx.HTTPError as exc:
            raise BrokerUnavailable(type(exc).__name__) from None
        if answer.status_code == 410:
            raise BrokerGone(f"HTTP 410 for {path}: the broker has ended this attempt")
        if answer.status_code in (401, 403):  # a broker restored or misconfigured may know us again: retry
            raise BrokerUnavailable(f"HTTP {answer.status_code}: the broker refused the agent token")
        # 404/409: nothing to give this attempt (credentials of a file:// root, of an ended attempt).
        if answer.status_code in (400, 404, 409, 413, 422):
            raise BrokerRejected(f"HTTP {answer.status_code} for {path}")
        if answer.status_code != 200:
            raise BrokerUnavailable(f"HTTP {answer.status_code}")
        return answer


def _json_or_empty(answer: httpx.Response) -> dict[str, Any]:
    try:
        payload = answer.json()
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}


class Delivery(threading.Thread):
    """A loop that delivers to the broker until told to finish, then until it
    has delivered everything (or a deadline passes, if one was given); it
    stops at once when told to stop, or when the broker says the attempt is
    gone (then `on_gone` is called)."""

    def __init__(self, name: str, config: RunnerConfig, on_gone: Callable[[], None] | None = None) -> None:
        super().__init__(name=name, daemon=True)
        self.config = config
        self.on_gone = on_gone
        self.failures = 0
        self.gone = False
        self._finish_by: float | None = None
        self._finishing = threading.Event()
        self._halt = threading.Event()

    def finish(self, deadline: float | None = None) -> None:
        """Deliver what is left, then end (by the monotonic `deadline`, if given)."""
        self._finish_by = deadline
        self._finishing.set()

    def stop(self) -> None:
        self._halt.set()
        self._finishing.set()

    def _should_end(self) -> bool:
        """Stopped, or finishing past its deadline."""
        past = self._finish_by is not None and time.monotonic() >= self._finish_by
        return self._halt.is_set() or (self._finishing.is_set() and past)

    def _broker_gone(self, exc: BrokerGone) -> None:
        log.warning("%s: %s; delivering nothing more", self.name, exc)
        self.gone = True
        self._halt.set()
        if self.on_gone is not None:
            self.on_gone()

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        if self.failures == 1 or self.failures % 20 == 0:
            log.warning("%s: broker unreachable (%d in a row), will retry: %s", self.name, self.failures, exc)
        delay = jittered_backoff(self.failures, self.config.retry_initial, self.config.retry_max)
        if self._finish_by is not None:  # past the deadline the client is closed: never sleep beyond it
            delay = max(0.0, min(delay, self._finish_by - time.monotonic()))
        self._halt.wait(delay)

    def _pause(self, seconds: float) -> None:
        """Wait for more to deliver, or less when finishing is asked."""
        if not self._finishing.is_set():
            self._finishing.wait(seconds)

    def _recovered(self) -> None:
        if self.failures:
            log.info("%s: broker reachable again after %d failures", self.name, self.failures)
        self.failures = 0


class EventSender(Delivery):
    """Posts the outbox's events in seq order; the broker ignores a seq it already has.

    The broker's answer may ask for a drain (checkpoint, the attempt is being
    moved) or a cancel (stop the trainer): each answer that says so calls
    `on_drain` / `on_cancel`, which see to doing it once.
    """

    def __init__(self, outbox: Outbox, client: BrokerClient, config: RunnerConfig,
                 on_cancel: Callable[[], None], on_drain: Callable[[float | None], None] | None = None,
                 on_gone: Callable[[], None] | None = None, node: int = 0,
                 on_stop: Callable[[], None] | None = None,
                 on_interval: Callable[[float | None], None] | None = None) -> None:
        super().__init__("event-sender", config, on_gone)
        self.on_stop = on_stop  # the broker's early stop: checkpoint, then the trainer ends
        self.on_interval = on_interval  # the broker's checkpoint interval, with every answer that has one
        self.node = node  # > 0: a multi-node job's other node; its events say which
        self.outbox = outbox
        self.client = client
        self.on_cancel = on_cancel
        self.on_drain = on_drain

    def run(self) -> None:
        while True:
            if self._should_end():
                left = len(self.outbox.batch())
                if left:
                    log.warning("%d events left undelivered; they stay in the outbox", left)
                return
            finishing = self._finishing.is_set()  # before the look: what came before finish() is seen
            if not self.outbox.wait_pending(0.2):
                if finishing:
                    return  # everything delivered
                continue
            batch = self.outbox.batch()
            try:
                answer = self._post(batch)
            except BrokerUnavailable as exc:
                self._failed(exc)
                continue
            except BrokerGone as exc:
                self._broker_gone(exc)
                continue
            self._recovered()
            self.outbox.ack(batch[-1]["seq"])
            _log_notice_latency(batch)
            # A drain first: when both come at once, the flush is at least asked for.
            if answer.get(ANSWER_DRAIN) is True and self.on_drain is not None:
                seconds = answer.get(ANSWER_DRAIN_SECONDS)
                self.on_drain(float(seconds) if isinstance(seconds, int | float) and seconds > 0 else None)
            if answer.get(ANSWER_STOP) is True and self.on_stop is not None:
                self.on_stop()
            if ANSWER_CHECKPOINT_INTERVAL in answer and self.on_interval is not None:
                seconds = answer[ANSWER_CHECKPOINT_INTERVAL]
                self.on_interval(float(seconds) if isinstance(seconds, int | float) and seconds > 0 else None)
            if answer.get(ANSWER_CANCEL) is True:
                self.on_cancel()

    def _post(self, batch: list[dict[str, Any]]) -> dict[str, Any]:
        """Post a batch; if the broker rejects it, post one by one and drop only what it rejects."""
        try:
            if self.node:
                return self.client.post_events([{**e, "data": {**e["data"], EVENT_NODE: self.node}} for e in batch])
            return self.client.post_events(batch)
        except BrokerRejected as exc:
            if len(batch) == 1:
                log.error("the broker rejected event %d (%s, %s); dropping it", batch[0]["seq"], batch[0]["type"], exc)
                return {}
        answer: dict[str, Any] = {}
        for event in batch:
            answer = self._post([event]) or answer
        return answer


def _log_notice_latency(batch: list[dict[str, Any]]) -> None:
    for event in batch:
        if event["type"] == PREEMPTION_NOTICE and event["data"].get("observed_at"):
            seen = datetime.fromisoformat(event["data"]["observed_at"])
            delay = (datetime.now(UTC) - seen).total_seconds()
            log.info("preemption notice delivered to the broker %.0f ms after it was seen", delay * 1000)


class LogShipper(Delivery):
    """Ships the trainer's log file to the broker from the offset the broker
    has: the log of node `node` (each node's agent ships its own)."""

    def __init__(self, path: Path, client: BrokerClient, config: RunnerConfig,
                 on_gone: Callable[[], None] | None = None, node: int = 0) -> None:
        super().__init__("log-shipper", config, on_gone)
        self.path = path
        self.node = node
        self.client = client
        self.shipped = 0

    def run(self) -> None:
        while not self._should_end():
            # Read before the file's size is: a chunk that was in flight when
            # finish() came may have left the trainer's last output behind.
            finishing = self._finishing.is_set()
            try:
                done = self._ship_once()
            except BrokerUnavailable as exc:
                self._failed(exc)
                continue
            except BrokerGone as exc:
                self._broker_gone(exc)
                return
            self._recovered()
            if done:
                if finishing:
                    return  # the whole log delivered
                self._pause(self.config.log_interval)
        if self.shipped < log_size(self.path):
            log.warning("the log is shipped up to byte %d of %d", self.shipped, log_size(self.path))

    def _ship_once(self) -> bool:
        """Send the next chunk; True when the broker has the whole file."""
        size = log_size(self.path)
        if self.shipped >= size:
            return True
        with open(self.path, "rb") as log_file:
            log_file.seek(self.shipped)
            chunk = log_file.read(LOG_CHUNK)
        try:
            stored = self.client.post_log(self.shipped, chunk, self.node)
        except BrokerRejected as exc:
            log.error("the broker rejected log bytes %d..%d (%s); skipping them", self.shipped,
                      self.shipped + len(chunk), exc)
            stored = self.shipped + len(chunk)
        # The broker's size is the truth: less means it lacks bytes (re-send), more means it has them.
        self.shipped = min(stored, size)
        return self.shipped >= size


def log_size(path: Path) -> int:
    """The log file's length in bytes (0 before the trainer printed)."""
    return path.stat().st_size if path.exists() else 0
