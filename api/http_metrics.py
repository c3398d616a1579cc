"""This process's own metrics, beside the deployment's (broker/metrics/collector.py):
every HTTP request counted and timed by route template (`/v1/jobs/{job_id}`,
never the raw path, so that the number of series stays bounded), and the
process's CPU, memory, file descriptors and Python runtime (prometheus_client's
collectors). Each replica exports its own; `sum()` over pods is their total.
With `serve --workers N` each worker process keeps its own numbers and a scrape
reaches one of them: run one worker per pod where these matter."""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED = "unmatched"  # a path no route has (404s): one series, whatever was asked
# Any other method a client makes up is "other": a label's values stay few whatever clients send.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def process_registry() -> CollectorRegistry:
    """A registry of this process's collectors (one per app: tests build many)."""
    # not described at registration: the deployment collector reads (and leases) only when scraped
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


class RequestMetrics:
    """Plain ASGI middleware: counts and times each HTTP request once its answer has started."""

    def __init__(self, app: ASGIApp, registry: CollectorRegistry) -> None:
        self.app = app
        self.requests = Counter("spotbroker_http_requests", "HTTP requests answered, by route and status",
                                ["method", "route", "status"], registry=registry)
        self.seconds = Histogram("spotbroker_http_request_duration_seconds", "Seconds from a request's arrival "
                                 "to the end of its answer (a followed log stream lasts as long as it is followed)",
                                 ["method", "route"], registry=registry)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), 0

        async def observed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
        finally:
            route = getattr(scope.get("route"), "path", None) or UNMATCHED
            method = scope["method"] if scope["method"] in METHODS else "other"
            # status 0: the client left before any answer began
            self.requests.labels(method, route, str(status)).inc()
            self.seconds.labels(method, route).observe(time.perf_counter() - started)
