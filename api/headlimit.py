"""A bound on a request's head (its line and headers), for `spotbroker serve`.

uvicorn's httptools protocol keeps a head without a limit, copying it as it
grows: one connection sending a 200 MB header, before any token is checked,
held the event loop (every team's requests, the agents' reports) for 80 s,
and twice its size of memory. Past MAX_HEAD_BYTES before the head ends, the
request is answered 431 and the connection closed; what the client still
sends meanwhile is read and dropped for a moment, so that it reads the answer
rather than a reset.

A head must also come whole within SPOTBROKER_HEAD_TIMEOUT_SECONDS of its
first byte (or of the connection, for the first): 50 connections that sent a
few bytes of a header every 20 s were all held open, with no token, and
nothing bounded how many (uvicorn's keep-alive timer stops at the first byte
of a request). Past it, 408 and closed.
"""
from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD_BYTES = 64 * 1024
LINGER_SECONDS = 2.0
def _answer(status: int, reason: str, detail: str) -> bytes:
    """A whole problem response that closes the connection, written before any app sees the request."""
    body = json.dumps({"type": "about:blank", "title": reason.capitalize(), "status": status,
                       "detail": detail}).encode()
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/problem+json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, reason.title().encode(), len(body), body))


_TOO_LARGE = _answer(431, "request header fields too large",
                     f"the request line and headers are at most {MAX_HEAD_BYTES} bytes")


def head_timeout() -> float:
    """The setting, read once per server process (each worker reads its own environment)."""
    from spotbroker.broker.settings import get_settings

    return get_settings().head_timeout_seconds


class BoundedHead(HttpToolsProtocol):
    # Bytes received since the head being read began (a connection starts in one).
    _in_head, _head_bytes, _refused = True, 0, False
    _deadline: asyncio.TimerHandle | None = None
    timeout_s: float | None = None  # head_timeout(), once per process

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_deadline()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._start_deadline()

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes = False, 0
        self._stop_deadline()
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:  # the head may end in this chunk: the parser says so (and starts counting anew)
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > MAX_HEAD_BYTES:
            self._refuse(_TOO_LARGE)

    def _start_deadline(self) -> None:
        if self._deadline is None:
            if BoundedHead.timeout_s is None:
                BoundedHead.timeout_s = head_timeout()
            self._deadline = asyncio.get_running_loop().call_later(BoundedHead.timeout_s, self._too_slow)

    def _stop_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self._in_head and not self._refused and not self.transport.is_closing():
            self._refuse(_answer(408, "request timeout", "the request line and headers did not come whole in "
                                 f"{BoundedHead.timeout_s:g} s"))

    def _refuse(self, answer: bytes) -> None:
        self._refused = True
        self._stop_deadline()
        self.transport.write(answer)
        asyncio.get_running_loop().call_later(LINGER_SECONDS, self.transport.close)
