"""The simulator's HTTP side: a threaded stdlib server whose handler hands every
request to :meth:`MetadataSimulator.handle` and writes the :class:`Reply` back."""
from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from spotbroker.agent.metadata_sim.instance import MetadataSimulator

# Hung requests are released at the latest after this long, or when the fault is cleared.
HANG_LIMIT_S = 600.0
# The clouds' bodies are a few hundred bytes (an Azure event's acknowledgement, a
# control call). The local launcher runs the simulator as root, on a port any job
# on the host can find: a larger body is refused before it is read.
MAX_BODY_BYTES = 64 * 1024


@dataclass
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "text/plain"
    headers: dict[str, str] = field(default_factory=dict)


def json_reply(payload: Any, status: int = 200) -> Reply:
    return Reply(status, json.dumps(payload).encode(), "application/json; charset=utf-8")


# Connections served at once (a thread each); past them a new one is closed at once. The
# agents of a node use one or two; any job on the host can open more.
MAX_CONNECTIONS = 64
IDLE_TIMEOUT_S = 120.0  # a connection that sends nothing for this long is closed (a long poll waits in the server)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], sim: MetadataSimulator) -> None:
        self.sim = sim
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client giving up on a slow or hung answer is part of the game, not an error.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real services
    server_version = "MetadataSimulator"
    timeout = IDLE_TIMEOUT_S
    server: Server

    def _serve(self) -> None:
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        declared = self.headers.get("Content-Length") or "0"
        length = int(declared) if declared.isascii() and declared.isdigit() else -1
        if not 0 <= length <= MAX_BODY_BYTES:
            self.close_connection = True  # (the body stays unread)
            self._reply(Reply(413 if length > MAX_BODY_BYTES else 400, b"a body of 0 to %d bytes" % MAX_BODY_BYTES))
            return
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = self.server.sim.handle(self.command, split.path, query, headers, body)
        if reply is None:  # a hang: drop the connection unanswered
            self.close_connection = True
            return
        self._reply(reply)

    def _reply(self, reply: Reply) -> None:
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
