"""A metadata-service simulator that speaks AWS, GCP and Azure as documented.

One small stdlib HTTP server plays one cloud's instance metadata service:

* **aws** — IMDSv2: `PUT /latest/api/token` with
  `X-aws-ec2-metadata-token-ttl-seconds` (400 without it or out of 1..21600),
  reads need `X-aws-ec2-metadata-token` (401 without, or with an unknown or
  expired one); `spot/instance-action` and
  `events/recommendations/rebalance` answer 404 until the notice.
* **gcp** — everything under `/computeMetadata/v1/` needs
  `Metadata-Flavor: Google` (403 without); `instance/preempted` turns from
  `FALSE` to `TRUE`, `instance/maintenance-event` from `NONE`; answers carry
  an `ETag`, and `?wait_for_change=true&last_etag=...&timeout_sec=...`
  long-polls until the value changes.
* **azure** — Scheduled Events at `/metadata/scheduledevents?api-version=...`
  need `Metadata: true` (400 without); a `Preempt` event appears with its
  `NotBefore`; `DocumentIncarnation` grows on every change; a `POST` of
  `StartRequests` acknowledges an event, which then starts.

A notice comes after a delay, at a given time, or on command: the Python API
(`preempt()`, `rebalance()`, `maintenance()`) or the control endpoints under
`/_sim/` (`POST /_sim/preempt {"notice_seconds": N}`, ...). The notice window
(notice → the cloud's hard stop) is the cloud's own unless given. Fault
modes (`garbage`, `500`, `hang`) let tests check that a watcher survives.

Run it alone: `python -m spotbroker.agent.simulator --cloud aws --port 0`
prints its URL; or embed it: `with MetadataSimulator("gcp") as sim: sim.url`.
Standard library only, so the local launcher can start one per attempt.
"""
from __future__ import annotations

import argparse
import email.utils
import hashlib
import json
import os
import secrets
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

CLOUDS = ("aws", "gcp", "azure")
# The documented time between the notice and the hard stop (Azure: at least 30 s).
DEFAULT_WINDOWS = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
# GCP warns of host maintenance on GPU VMs 60 s ahead.
GCP_MAINTENANCE_WINDOW = 60.0
FAULT_MODES = ("garbage", "500", "hang")

AWS_TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
AWS_TOKEN_HEADER = "X-aws-ec2-metadata-token"
AWS_MAX_TOKEN_TTL = 21600
AZURE_EVENTS_API_VERSIONS = frozenset({"2017-03-01", "2017-11-01", "2019-01-01", "2019-08-01", "2020-07-01"})
# Hung requests are released at the latest after this long, or when the fault is cleared.
HANG_LIMIT_S = 600.0


def aws_time(at: datetime) -> str:
    """AWS writes `2026-11-21T00:50:02Z`."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc1123(at: datetime) -> str:
    """Azure's NotBefore: `Sat, 21 Nov 2026 00:50:02 GMT`."""
    return email.utils.format_datetime(at.astimezone(UTC), usegmt=True)


@dataclass
class _Reply:
    status: int
    body: bytes = b""
    content_type: str = "text/plain"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Fault:
    mode: str | None = None
    remaining: int | None = None  # None: until cleared


class MetadataSimulator:
    """One cloud's metadata service on a local port; thread-safe."""

    def __init__(
        self,
        cloud: str = "aws",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        notice_window: float | None = None,
        notice_after: float | None = None,
        notice_at: datetime | None = None,
        rebalance_after: float | None = None,
        instance_id: str = "i-0123456789abcdef0",
        vm_name: str = "spotbroker-vm-0",
        zone: str | None = None,
        on_hard_stop: Callable[[], None] | None = None,
    ) -> None:
        if cloud not in CLOUDS:
            raise ValueError(f"cloud must be one of {', '.join(CLOUDS)}, not {cloud!r}")
        self.cloud = cloud
        self.notice_window = DEFAULT_WINDOWS[cloud] if notice_window is None else float(notice_window)
        self.instance_id = instance_id
        self.vm_name = vm_name
        self.zone = zone or {"aws": "us-east-1a", "gcp": "us-central1-a", "azure": "1"}[cloud]
        self.on_hard_stop = on_hard_stop
        self._host, self._port = host, port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._timers: list[threading.Timer] = []
        self._changed = threading.Condition()  # guards all state; notified on every change
        self._release_hangs = threading.Event()
        self._stopping = threading.Event()
        self._fault = _Fault()
        self._tokens: dict[str, float] = {}  # AWS token -> monotonic expiry
        self.notice_time: datetime | None = None
        self.deadline: datetime | None = None
        self.rebalance_time: datetime | None = None
        self.maintenance_event = "NONE"
        self.maintenance_deadline: datetime | None = None
        self._azure_events: list[dict[str, Any]] = []
        self.incarnation = 1
        self.acknowledged: list[str] = []
        self.requests = 0          # metadata requests served (control endpoints excluded)
        self.faulted_requests = 0  # of which answered by a fault mode
        self.hits: Counter[str] = Counter()  # metadata requests per path
        self.statuses: Counter[int] = Counter()  # metadata answers per status (faults excluded)
        self._start_triggers = (notice_after, notice_at, rebalance_after)

    # --- life cycle -------------------------------------------------------

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("simulator not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> MetadataSimulator:
        server = _Server((self._host, self._port), _Handler)
        server.sim = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,),
                                        name=f"metadata-sim-{self.cloud}", daemon=True)
        self._thread.start()
        notice_after, notice_at, rebalance_after = self._start_triggers
        if notice_after is not None:
            self._later(notice_after, self.preempt)
        if notice_at is not None:
            self._later((notice_at - _now()).total_seconds(), self.preempt)
        if rebalance_after is not None:
            self._later(rebalance_after, self.rebalance)
        return self

    def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._stopping.set()
        self._release_hangs.set()
        with self._changed:
            self._changed.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> MetadataSimulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _later(self, delay: float, action: Callable[[], object]) -> None:
        timer = threading.Timer(max(0.0, delay), action)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    # --- triggers (Python API; the control endpoints call these) ----------

    def preempt(self, notice_seconds: float | None = None) -> datetime:
        """Publish the preemption notice; the hard stop comes `notice_seconds` later."""
        window = self.notice_window if notice_seconds is None else float(notice_seconds)
        with self._changed:
            if self.deadline is not None:  # one notice per instance, as on a real node
                return self.deadline
            self.notice_time = _now()
            self.deadline = self.notice_time + timedelta(seconds=window)
            if self.cloud == "azure":
                self._azure_events.append(self._preempt_event(self.deadline))
                self.incarnation += 1
            self._changed.notify_all()
        self._later(window, self._hard_stop)
        return self.deadline

    def rebalance(self) -> datetime:
        """AWS's rebalance recommendation (elevated risk of interruption)."""
        with self._changed:
            if self.rebalance_time is None:
                self.rebalance_time = _now()
                self._changed.notify_all()
            return self.rebalance_time

    def maintenance(self, event: str = "TERMINATE_ON_HOST_MAINTENANCE",
                    notice_seconds: float | None = None) -> datetime:
        """GCP's host-maintenance warning (GPU VMs are stopped, 60 s ahead)."""
        window = GCP_MAINTENANCE_WINDOW if notice_seconds is None else float(notice_seconds)
        with self._changed:
            self.maintenance_event = event
            self.maintenance_deadline = _now() + timedelta(seconds=window)
            self._changed.notify_all()
            return self.maintenance_deadline

    def set_fault(self, mode: str | None, count: int | None = None) -> None:
        """Answer metadata requests with `garbage`, `500` or by hanging; None clears."""
        if mode is not None and mode not in FAULT_MODES:
            raise ValueError(f"fault mode must be one of {', '.join(FAULT_MODES)} or None")
        with self._changed:
            self._fault = _Fault(mode, count)
            if mode != "hang":
                self._release_hangs.set()
            else:
                self._release_hangs.clear()

    def revoke_tokens(self) -> None:
        """Forget every IMDSv2 token (as after an IMDS restart): the next read is 401."""
        with self._changed:
            self._tokens.clear()

    def state(self) -> dict[str, Any]:
        with self._changed:
            return {
                "cloud": self.cloud,
                "url": self.url,
                "notice_window": self.notice_window,
                "notice_time": self.notice_time.isoformat() if self.notice_time else None,
                "deadline": self.deadline.isoformat() if self.deadline else None,
                "rebalance_time": self.rebalance_time.isoformat() if self.rebalance_time else None,
                "maintenance_event": self.maintenance_event,
                "incarnation": self.incarnation,
                "acknowledged": list(self.acknowledged),
                "fault": self._fault.mode,
                "requests": self.requests,
                "faulted_requests": self.faulted_requests,
            }

    def _hard_stop(self) -> None:
        # Azure starts a Preempt event at NotBefore whether or not it was acknowledged.
        with self._changed:
            for event in self._azure_events:
                if event["EventStatus"] == "Scheduled":
                    event["EventStatus"] = "Started"
                    self.incarnation += 1
            self._changed.notify_all()
        if self.on_hard_stop is not None:
            self.on_hard_stop()

    def _preempt_event(self, not_before: datetime) -> dict[str, Any]:
        return {
            "EventId": str(uuid.uuid4()).upper(),
            "EventType": "Preempt",
            "ResourceType": "VirtualMachine",
            "Resources": [self.vm_name],
            "EventStatus": "Scheduled",
            "NotBefore": rfc1123(not_before),
            "Description": "The Spot Virtual Machine is being evicted.",
            "EventSource": "Platform",
            "DurationInSeconds": -1,
        }

    # --- request handling -------------------------------------------------

    def _take_fault(self, path: str) -> str | None:
        with self._changed:
            self.requests += 1
            self.hits[path] += 1
            fault = self._fault
            if fault.mode is None:
                return None
            self.faulted_requests += 1
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self._fault = _Fault()
            return fault.mode

    def _faulted(self, mode: str) -> _Reply | None:
        if mode == "500":
            return _Reply(500, b"Internal Server Error\n")
        if mode == "garbage":
            return _Reply(200, b"\x00\xff<html>not what you asked for" + secrets.token_bytes(8), "text/html")
        self._release_hangs.wait(HANG_LIMIT_S)
        return None  # the connection is dropped without an answer

    def handle(self, method: str, path: str, query: dict[str, str], headers: dict[str, str],
               body: bytes) -> _Reply | None:
        if path.startswith("/_sim/"):
            return self._control(method, path, body)
        mode = self._take_fault(path)
        if mode is not None:
            return self._faulted(mode)
        if self.cloud == "aws":
            reply = self._aws(method, path, headers)
        elif self.cloud == "gcp":
            reply = self._gcp(method, path, query, headers)
        else:
            reply = self._azure(method, path, query, headers, body)
        with self._changed:
            self.statuses[reply.status] += 1
        return reply

    # --- AWS IMDSv2 -------------------------------------------------------

    def _aws(self, method: str, path: str, headers: dict[str, str]) -> _Reply:
        if path == "/latest/api/token":
            if method != "PUT":
                return _Reply(405, b"Method Not Allowed\n")
            return self._aws_token(headers)
        if not path.startswith("/latest/"):
            return _Reply(404, b"Not Found\n")
        if method != "GET":
            return _Reply(405, b"Method Not Allowed\n")
        token = headers.get("x-aws-ec2-metadata-token")
        with self._changed:
            expiry = self._tokens.get(token or "")
        if expiry is None or expiry <= time.monotonic():
            return _Reply(401, b"Unauthorized\n")
        value = self._aws_value(path)
        return _Reply(404, b"Not Found\n") if value is None else _Reply(200, value.encode())

    def _aws_token(self, headers: dict[str, str]) -> _Reply:
        if "x-forwarded-for" in headers:  # IMDSv2 refuses tokens through a proxy
            return _Reply(403, b"Forbidden\n")
        raw_ttl = headers.get(AWS_TOKEN_TTL_HEADER.lower())
        if raw_ttl is None or not raw_ttl.strip().isdigit():
            return _Reply(400, b"Bad Request\n")
        ttl = int(raw_ttl)
        if not 1 <= ttl <= AWS_MAX_TOKEN_TTL:
            return _Reply(400, b"Bad Request\n")
        token = secrets.token_urlsafe(40)
        with self._changed:
            now = time.monotonic()
            self._tokens = {t: e for t, e in self._tokens.items() if e > now}
            self._tokens[token] = now + ttl
        return _Reply(200, token.encode(), headers={AWS_TOKEN_TTL_HEADER: str(ttl)})

    def _aws_value(self, path: str) -> str | None:
        region = self.zone[:-1]
        with self._changed:
            deadline, rebalance = self.deadline, self.rebalance_time
        values: dict[str, str | None] = {
            "/latest/meta-data/instance-id": self.instance_id,
            "/latest/meta-data/instance-type": "p4d.24xlarge",
            "/latest/meta-data/instance-life-cycle": "spot",
            "/latest/meta-data/placement/availability-zone": self.zone,
            "/latest/meta-data/placement/region": region,
            "/latest/meta-data/spot/instance-action": (
                json.dumps({"action": "terminate", "time": aws_time(deadline)}) if deadline else None
            ),
            "/latest/meta-data/spot/termination-time": aws_time(deadline) if deadline else None,
            "/latest/meta-data/events/recommendations/rebalance": (
                json.dumps({"noticeTime": aws_time(rebalance)}) if rebalance else None
            ),
        }
        if path in ("/latest/meta-data", "/latest/meta-data/"):
            return "instance-id\ninstance-life-cycle\ninstance-type\nplacement/\nspot/\nevents/"
        return values.get(path)

    # --- GCP --------------------------------------------------------------

    def _gcp(self, method: str, path: str, query: dict[str, str], headers: dict[str, str]) -> _Reply:
        flavor = {"Metadata-Flavor": "Google"}
        if path == "/":  # the root answers anyone, with the flavor header (used for detection)
            return _Reply(200, b"computeMetadata/\n", headers=flavor)
        if not path.startswith("/computeMetadata/v1/"):
            return _Reply(404, b"Not Found\n", headers=flavor)
        if "x-forwarded-for" in headers or headers.get("metadata-flavor") != "Google":
            return _Reply(403, b"Missing Metadata-Flavor:Google header.\n", headers=flavor)
        if method != "GET":
            return _Reply(405, b"Method Not Allowed\n", headers=flavor)
        key = path[len("/computeMetadata/v1/"):]
        value = self._gcp_value(key)
        if value is None:
            return _Reply(404, b"Not Found\n", headers=flavor)
        if query.get("wait_for_change", "").lower() == "true":
            value = self._gcp_wait(key, value, query)
        return _Reply(200, value.encode(), "application/text", {**flavor, "ETag": _etag(value)})

    def _gcp_value(self, key: str) -> str | None:
        with self._changed:
            preempted = self.deadline is not None
            maintenance = self.maintenance_event
        values = {
            "instance/preempted": "TRUE" if preempted else "FALSE",
            "instance/maintenance-event": maintenance,
            "instance/id": "4520031799277581759",
            "instance/name": self.vm_name,
            "instance/hostname": f"{self.vm_name}.c.spotbroker-test.internal",
            "instance/zone": f"projects/123456789012/zones/{self.zone}",
            "instance/machine-type": "projects/123456789012/machineTypes/a2-highgpu-1g",
            "instance/scheduling/provisioning-model": "SPOT",
            "project/project-id": "spotbroker-test",
        }
        return values.get(key)

    def _gcp_wait(self, key: str, value: str, query: dict[str, str]) -> str:
        """Block until the value's ETag differs from `last_etag` (or the current one), or timeout_sec."""
        last = query.get("last_etag") or _etag(value)
        try:
            timeout = float(query.get("timeout_sec", HANG_LIMIT_S))
        except ValueError:
            timeout = HANG_LIMIT_S
        end = time.monotonic() + max(0.0, timeout)
        with self._changed:
            while True:
                current = self._gcp_value(key) or ""
                remaining = end - time.monotonic()
                if _etag(current) != last or remaining <= 0 or self._stopping.is_set():
                    return current
                self._changed.wait(remaining)

    # --- Azure ------------------------------------------------------------

    def _azure(self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: bytes) -> _Reply:
        if not path.startswith("/metadata/"):
            return _Reply(404, b"Not Found\n")
        if "x-forwarded-for" in headers or headers.get("metadata", "").lower() != "true":
            return _azure_error(400, "Bad request. Required metadata header not specified")
        version = query.get("api-version")
        if not version:
            return _azure_error(400, "Bad request. api-version was not specified in the request")
        if path == "/metadata/scheduledevents":
            if version not in AZURE_EVENTS_API_VERSIONS:
                return _azure_error(400, "Bad request. api-version is invalid or was not specified in the request")
            if method == "GET":
                return self._azure_events_document()
            if method == "POST":
                return self._azure_ack(body)
            return _azure_error(405, "Method not allowed")
        if method != "GET":
            return _azure_error(405, "Method not allowed")
        compute = self._azure_compute()
        if path == "/metadata/instance/compute":
            return _json_reply(compute)
        if path == "/metadata/instance":
            return _json_reply({"compute": compute, "network": {"interface": []}})
        return _azure_error(404, "Not found")

    def _azure_events_document(self) -> _Reply:
        with self._changed:
            document = {"DocumentIncarnation": self.incarnation, "Events": [dict(e) for e in self._azure_events]}
        return _json_reply(document)

    def _azure_ack(self, body: bytes) -> _Reply:
        try:
            requests = json.loads(body or b"{}")["StartRequests"]
            ids = [str(r["EventId"]) for r in requests]
        except (ValueError, KeyError, TypeError):
            return _azure_error(400, "Bad request. Body must be {\"StartRequests\": [{\"EventId\": ...}]}")
        with self._changed:
            known = {e["EventId"]: e for e in self._azure_events}
            unknown = [i for i in ids if i not in known]
            if unknown:
                return _azure_error(400, f"Bad request. Unknown EventId {unknown[0]}")
            for event_id in ids:
                self.acknowledged.append(event_id)
                if known[event_id]["EventStatus"] == "Scheduled":
                    known[event_id]["EventStatus"] = "Started"  # approved: the platform goes ahead
                    self.incarnation += 1
            self._changed.notify_all()
        return _Reply(200, b"", "application/json")

    def _azure_compute(self) -> dict[str, Any]:
        return {
            "name": self.vm_name,
            "vmId": "8d2b7c5e-0b4f-4e8a-9d0c-2b1f6c3e7a10",
            "location": "eastus",
            "zone": self.zone,
            "vmSize": "Standard_NC24ads_A100_v4",
            "priority": "Spot",
            "evictionPolicy": "Delete",
            "resourceGroupName": "spotbroker",
            "subscriptionId": "00000000-0000-0000-0000-000000000000",
        }

    # --- control endpoints ------------------------------------------------

    def _control(self, method: str, path: str, body: bytes) -> _Reply:
        if method == "GET" and path == "/_sim/state":
            return _json_reply(self.state())
        if method != "POST":
            return _json_reply({"error": "use POST"}, 405)
        try:
            args = json.loads(body) if body.strip() else {}
            if not isinstance(args, dict):
                raise ValueError("body must be a JSON object")
            if path == "/_sim/preempt":
                deadline = self.preempt(args.get("notice_seconds"))
                return _json_reply({"deadline": deadline.isoformat(), "state": self.state()})
            if path == "/_sim/rebalance":
                return _json_reply({"notice_time": self.rebalance().isoformat()})
            if path == "/_sim/maintenance":
                at = self.maintenance(args.get("event", "TERMINATE_ON_HOST_MAINTENANCE"), args.get("notice_seconds"))
                return _json_reply({"deadline": at.isoformat()})
            if path == "/_sim/fault":
                self.set_fault(args.get("mode"), args.get("count"))
                return _json_reply(self.state())
            if path == "/_sim/revoke-tokens":
                self.revoke_tokens()
                return _json_reply({"revoked": True})
        except (ValueError, TypeError) as exc:
            return _json_reply({"error": str(exc)}, 400)
        return _json_reply({"error": f"no control endpoint {path}"}, 404)


def _now() -> datetime:
    return datetime.now(UTC)


def _etag(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def _json_reply(payload: Any, status: int = 200) -> _Reply:
    return _Reply(status, json.dumps(payload).encode(), "application/json; charset=utf-8")


def _azure_error(status: int, message: str) -> _Reply:
    return _json_reply({"error": message}, status)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client giving up on a slow or hung answer is part of the game, not an error.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real services
    server_version = "MetadataSimulator"

    def _serve(self) -> None:
        sim: MetadataSimulator = self.server.sim  # type: ignore[attr-defined]
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = sim.handle(self.command, split.path, query, headers, body)
        if reply is None:  # a hang: drop the connection unanswered
            self.close_connection = True
            return
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(reply.body)

    do_GET = do_PUT = do_POST = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass  # quiet: tests and the local launcher poll it many times a second


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m spotbroker.agent.simulator", description=__doc__.split("\n")[0])
    parser.add_argument("--cloud", choices=CLOUDS, default="aws")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--window", type=float, default=None,
                        help="notice window in seconds (default: the cloud's own)")
    parser.add_argument("--notice-after", type=float, default=None, help="publish the notice after this many seconds")
    parser.add_argument("--notice-at", default=None, help="publish the notice at this ISO 8601 time")
    parser.add_argument("--rebalance-after", type=float, default=None,
                        help="AWS rebalance recommendation after N seconds")
    parser.add_argument("--fault", choices=FAULT_MODES, default=None, help="answer metadata requests badly")
    parser.add_argument("--vm-name", default="spotbroker-vm-0")
    parser.add_argument("--instance-id", default="i-0123456789abcdef0")
    parser.add_argument("--kill-at-hard-stop", type=int, default=None, metavar="PID",
                        help="SIGKILL this process and every process below it, whatever their session, "
                             "when the notice window closes (the node is gone, this simulator with it)")
    return parser.parse_args(argv)


def _hard_stop(pid: int) -> None:
    from spotbroker.agent.proctree import kill_tree

    kill_tree(pid)
    os.kill(os.getpid(), signal.SIGKILL)  # the node's metadata service goes with it


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    notice_at = datetime.fromisoformat(args.notice_at) if args.notice_at else None
    if notice_at is not None and notice_at.tzinfo is None:
        notice_at = notice_at.replace(tzinfo=UTC)
    sim = MetadataSimulator(
        args.cloud, host=args.host, port=args.port, notice_window=args.window,
        notice_after=args.notice_after, notice_at=notice_at, rebalance_after=args.rebalance_after,
        vm_name=args.vm_name, instance_id=args.instance_id,
        on_hard_stop=(lambda: _hard_stop(args.kill_at_hard_stop)) if args.kill_at_hard_stop else None,
    )
    if args.fault:
        sim.set_fault(args.fault)
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    sim.start()
    print(sim.url, flush=True)  # the first line is the URL, for whoever started us
    stopped.wait()
    sim.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
