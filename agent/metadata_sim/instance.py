"""The simulated instance behind one cloud's metadata service: its state (the
notice, the deadline, tokens, scheduled events), the triggers that change it
(a delay, a time, the Python API or the ``/_sim/`` control endpoints), the
fault modes, and the dispatch of each request to its cloud's protocol
(:mod:`.aws`, :mod:`.gcp`, :mod:`.azure`)."""
from __future__ import annotations

import hmac
import json
import secrets
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from spotbroker.agent.metadata_sim import aws, azure, gcp
from spotbroker.agent.metadata_sim.server import HANG_LIMIT_S, Reply, Server, json_reply

CONTROL_HEADER = "x-sim-token"

CLOUDS = ("aws", "gcp", "azure")
# The documented time between the notice and the hard stop (Azure: at least 30 s).
DEFAULT_WINDOWS = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
FAULT_MODES = ("garbage", "500", "hang")
MAX_COUNTED_PATHS, MAX_COUNTED_PATH = 64, 256  # paths counted one by one in `hits`; the rest as OTHER_PATHS
OTHER_PATHS = "(other paths)"


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
        control_token: str | None = None,
    ) -> None:
        if cloud not in CLOUDS:
            raise ValueError(f"cloud must be one of {', '.join(CLOUDS)}, not {cloud!r}")
        self.cloud = cloud
        self.notice_window = DEFAULT_WINDOWS[cloud] if notice_window is None else float(notice_window)
        self.instance_id = instance_id
        self.vm_name = vm_name
        self.zone = zone or {"aws": "us-east-1a", "gcp": "us-central1-a", "azure": "1"}[cloud]
        self.on_hard_stop = on_hard_stop
        # With a token, the /_sim/ endpoints answer only a request that carries
        # it (X-Sim-Token): whoever else can reach the port (another job on the
        # host) cannot order a notice, a fault or a hard stop.
        self.control_token = control_token
        self._host, self._port = host, port
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self._timers: list[threading.Timer] = []
        self._release_hangs = threading.Event()
        self._fault = _Fault()
        # The instance's state, read and written by the protocol modules too.
        self.changed = threading.Condition()  # guards all state; notified on every change
        self.stopping = threading.Event()
        self.tokens: dict[str, float] = {}  # AWS token -> monotonic expiry
        self.notice_time: datetime | None = None
        self.deadline: datetime | None = None
        self.rebalance_time: datetime | None = None
        self.maintenance_event = "NONE"
        self.maintenance_deadline: datetime | None = None
        self.azure_events: list[dict[str, Any]] = []
        self.incarnation = 1
        self.acknowledged: list[str] = []
        self.requests = 0          # metadata requests served (control endpoints excluded)
        self.faulted_requests = 0  # of which answered by a fault mode
        self.hits: Counter[str] = Counter()  # metadata requests per path (bounded: OTHER_PATHS)
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
        server = Server((self._host, self._port), self)
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
        self.stopping.set()
        self._release_hangs.set()
        with self.changed:
            self.changed.notify_all()
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
        with self.changed:
            if self.deadline is not None:  # one notice per instance, as on a real node
                return self.deadline
            self.notice_time = _now()
            self.deadline = self.notice_time + timedelta(seconds=window)
            if self.cloud == "azure":
                self.azure_events.append(azure.preempt_event(self.vm_name, self.deadline))
                self.incarnation += 1
            self.changed.notify_all()
        self._later(window, self._hard_stop)
        return self.deadline

    def rebalance(self) -> datetime:
        """AWS's rebalance recommendation (elevated risk of interruption)."""
        with self.changed:
            if self.rebalance_time is None:
                self.rebalance_time = _now()
                self.changed.notify_all()
            return self.rebalance_time

    def maintenance(self, event: str = "TERMINATE_ON_HOST_MAINTENANCE",
                    notice_seconds: float | None = None) -> datetime:
        """GCP's host-maintenance warning (GPU VMs are stopped, 60 s ahead)."""
        window = gcp.MAINTENANCE_WINDOW if notice_seconds is None else float(notice_seconds)
        with self.changed:
            self.maintenance_event = event
            self.maintenance_deadline = _now() + timedelta(seconds=window)
            self.changed.notify_all()
            return self.maintenance_deadline

    def set_fault(self, mode: str | None, count: int | None = None) -> None:
        """Answer metadata requests with `garbage`, `500` or by hanging; None clears."""
        if mode is not None and mode not in FAULT_MODES:
            raise ValueError(f"fault mode must be one of {', '.join(FAULT_MODES)} or None")
        with self.changed:
            self._fault = _Fault(mode, count)
            if mode != "hang":
                self._release_hangs.set()
            else:
                self._release_hangs.clear()

    def revoke_tokens(self) -> None:
        """Forget every IMDSv2 token (as after an IMDS restart): the next read is 401."""
        with self.changed:
            self.tokens.clear()

    def state(self) -> dict[str, Any]:
        with self.changed:
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
        with self.changed:
            azure.start_scheduled(self)
            self.changed.notify_all()
        if self.on_hard_stop is not None:
            self.on_hard_stop()

    # --- request handling -------------------------------------------------

    def _take_fault(self, path: str) -> str | None:
        with self.changed:
            self.requests += 1
            # any job on the host can send any path: a bounded count (20,000 paths grew it by 1.3 GB)
            known = path in self.hits or (len(self.hits) < MAX_COUNTED_PATHS and len(path) <= MAX_COUNTED_PATH)
            self.hits[path if known else OTHER_PATHS] += 1
            fault = self._fault
            if fault.mode is None:
                return None
            self.faulted_requests += 1
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self._fault = _Fault()
            return fault.mode

    def _faulted(self, mode: str) -> Reply | None:
        if mode == "500":
            return Reply(500, b"Internal Server Error\n")
        if mode == "garbage":
            return Reply(200, b"\x00\xff<html>not what you asked for" + secrets.token_bytes(8), "text/html")
        self._release_hangs.wait(HANG_LIMIT_S)
        return None  # the connection is dropped without an answer

    def handle(self, method: str, path: str, query: dict[str, str], headers: dict[str, str],
               body: bytes) -> Reply | None:
        if path.startswith("/_sim/"):
            if self.control_token and not hmac.compare_digest(headers.get(CONTROL_HEADER, "").encode(),
                                                              self.control_token.encode()):
                return json_reply({"error": f"the control endpoints need the {CONTROL_HEADER} header"}, 403)
            return self._control(method, path, body)
        mode = self._take_fault(path)
        if mode is not None:
            return self._faulted(mode)
        if self.cloud == "aws":
            reply = aws.handle(self, method, path, headers)
        elif self.cloud == "gcp":
            reply = gcp.handle(self, method, path, query, headers)
        else:
            reply = azure.handle(self, method, path, query, headers, body)
        with self.changed:
            self.statuses[reply.status] += 1
        return reply

    # --- control endpoints ------------------------------------------------

    def _control(self, method: str, path: str, body: bytes) -> Reply:
        if method == "GET" and path == "/_sim/state":
            return json_reply(self.state())
        if method != "POST":
            return json_reply({"error": "use POST"}, 405)
        try:
            args = json.loads(body) if body.strip() else {}
            if not isinstance(args, dict):
                raise ValueError("body must be a JSON object")
            if path == "/_sim/preempt":
                deadline = self.preempt(args.get("notice_seconds"))
                return json_reply({"deadline": deadline.isoformat(), "state": self.state()})
            if path == "/_sim/rebalance":
                return json_reply({"notice_time": self.rebalance().isoformat()})
            if path == "/_sim/maintenance":
                at = self.maintenance(args.get("event", "TERMINATE_ON_HOST_MAINTENANCE"), args.get("notice_seconds"))
                return json_reply({"deadline": at.isoformat()})
            if path == "/_sim/fault":
                self.set_fault(args.get("mode"), args.get("count"))
                return json_reply(self.state())
            if path == "/_sim/revoke-tokens":
                self.revoke_tokens()
                return json_reply({"revoked": True})
        except (ValueError, TypeError) as exc:
            return json_reply({"error": str(exc)}, 400)
        return json_reply({"error": f"no control endpoint {path}"}, 404)


def _now() -> datetime:
    return datetime.now(UTC)
