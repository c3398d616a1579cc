"""Fixtures of the agent's tests: metadata simulators, a fake broker, waiting helpers.

Everything talks real HTTP on 127.0.0.1; nothing is patched.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

# moto's S3 server (real HTTP) for the storage and checkpoint tests.
from support.s3fixtures import moto_endpoint, s3_uri  # noqa: F401  (fixtures, found by name)

from spotbroker.agent.metadata_sim import MetadataSimulator
from spotbroker.agent.notices import Notice, WatchConfig
from spotbroker.agent.protocol import EVENTS_PATH, LOG_OFFSET_HEADER, LOGS_PATH

AGENT_TOKEN = "test-agent-token-7f3a"


def wait_until(condition: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll `condition` until it is truthy; fail the test after `timeout` seconds."""
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def wait() -> Callable[..., Any]:
    return wait_until


@pytest.fixture
def fast_config() -> WatchConfig:
    """Watcher timings shrunk to test size (the defaults are the clouds' own)."""
    return WatchConfig(
        poll_interval=0.05, request_timeout=0.5, backoff_initial=0.05, backoff_max=0.2,
        aws_token_ttl=60, gcp_long_poll=1, azure_first_timeout=0.5,
    )


@pytest.fixture
def make_sim() -> Iterator[Callable[..., MetadataSimulator]]:
    started: list[MetadataSimulator] = []

    def make(cloud: str, **kwargs: Any) -> MetadataSimulator:
        sim = MetadataSimulator(cloud, **kwargs).start()
        started.append(sim)
        return sim

    yield make
    for sim in started:
        sim.stop()


class Notices:
    """A thread-safe list of the notices a watcher delivered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[Notice] = []

    def __call__(self, notice: Notice) -> None:
        with self._lock:
            self.items.append(notice)

    def __len__(self) -> int:
        with self._lock:
            return len(self.items)

    def wait(self, count: int = 1, timeout: float = 10.0) -> list[Notice]:
        wait_until(lambda: len(self) >= count, timeout, f"{count} notice(s)")
        with self._lock:
            return list(self.items)


@pytest.fixture
def notices() -> Notices:
    return Notices()


# --- a fake broker ---------------------------------------------------------------


@dataclass
class FakeBroker:
    """Records what the agent posts; stores events by seq and logs by offset, as the protocol says."""

    token: str = AGENT_TOKEN
    port: int = 0
    events: dict[int, dict[str, Any]] = field(default_factory=dict)   # seq -> event
    arrivals: list[tuple[float, dict[str, Any]]] = field(default_factory=list)  # (monotonic, event) as received
    log_bytes: bytearray = field(default_factory=bytearray)
    log_posts: list[tuple[int, int]] = field(default_factory=list)     # (offset, length)
    log_size_at: dict[str, int] = field(default_factory=dict)  # event type -> log bytes held when it first came
    refused: int = 0          # requests with a wrong or missing token
    answers: int = 0          # event posts answered 200
    cancel: bool = False      # answer "cancel": true to the agent
    drain: bool | None = None  # answer "drain" with this value; None: leave it out (an older broker)
    drain_seconds: float | None = None  # with a drain: the broker's time for the flush
    stop_run: bool = False    # answer "stop": true (the job's early_stop rule fired)
    fail_status: int | None = None  # answer every request with this status
    reject_types: set[str] = field(default_factory=set)  # a batch holding one of these is a 422
    lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeBroker:
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), _broker_handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def ordered(self) -> list[dict[str, Any]]:
        with self.lock:
            return [self.events[s] for s in sorted(self.events)]

    def types(self, include_heartbeats: bool = False) -> list[str]:
        return [e["type"] for e in self.ordered() if include_heartbeats or e["type"] != "heartbeat"]

    def first(self, event_type: str) -> dict[str, Any] | None:
        return next((e for e in self.ordered() if e["type"] == event_type), None)

    def receive_events(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            for event in body["events"]:
                self.arrivals.append((time.monotonic(), event))
                self.log_size_at.setdefault(event["type"], len(self.log_bytes))
                self.events.setdefault(int(event["seq"]), event)  # a known seq is ignored
            last = max(self.events) if self.events else 0
            answer = {"accepted": len(body["events"]), "last_seq": last, "cancel": self.cancel}
            if self.drain is not None:
                answer["drain"] = self.drain
            if self.drain_seconds is not None:
                answer["drain_seconds"] = self.drain_seconds
            if self.stop_run:
                answer["stop"] = True
            self.answers += 1
            return answer

    def receive_log(self, offset: int, chunk: bytes) -> dict[str, Any]:
        with self.lock:
            self.log_posts.append((offset, len(chunk)))
            if offset <= len(self.log_bytes):  # a re-sent chunk overlaps: keep only the new tail
                self.log_bytes[offset:] = b""
                self.log_bytes += chunk
            return {"size": len(self.log_bytes)}


def _broker_handler(broker: FakeBroker) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Authorization") != f"Bearer {broker.token}":
                with broker.lock:
                    broker.refused += 1
                return self._answer(401, {"detail": "bad agent token"})
            if broker.fail_status is not None:
                return self._answer(broker.fail_status, {"detail": "failing on purpose"})
            if self.path == EVENTS_PATH:
                events = json.loads(body)
                if any(e["type"] in broker.reject_types for e in events["events"]):
                    return self._answer(422, {"detail": "unacceptable event"})
                return self._answer(200, broker.receive_events(events))
            if self.path == LOGS_PATH:
                return self._answer(200, broker.receive_log(int(self.headers[LOG_OFFSET_HEADER]), body))
            self._answer(404, {"detail": "no such path"})

        def _answer(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    return Handler


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    fake = FakeBroker().start()
    yield fake
    fake.stop()


@pytest.fixture
def free_port() -> int:
    """A port nothing listens on (yet): a broker that is down."""
    from support.ports import free_port as pick

    return pick()


@pytest.fixture
def broker_factory() -> Iterator[Callable[..., FakeBroker]]:
    made: list[FakeBroker] = []

    def make(port: int = 0) -> FakeBroker:
        fake = FakeBroker(port=port).start()
        made.append(fake)
        return fake

    yield make
    for fake in made:
        fake.stop()
