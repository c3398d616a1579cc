"""A bound on a request's head (its line and headers), for `spotbroker serve`.

uvicorn's httptools protocol keeps a head without a limit, copying it as it
grows: one connection sending a 200 MB header, before any token is checked,
held the event loop (every team's requests, the agents' reports) for 80 s,
and twice its size of memory. Past MAX_HEAD_BYTES before the head ends, the
request is answered 431 and the connection closed; what the client still
sends meanwhile is read and dropped for a moment, so that it reads the answer
rather than a reset.
"""
from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD_BYTES = 64 * 1024
LINGER_SECONDS = 2.0
_BODY = json.dumps({"type": "about:blank", "title": "Request header fields too large", "status": 431,
                    "detail": f"the request line and headers are at most {MAX_HEAD_BYTES} bytes"}).encode()
_ANSWER = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/problem+json\r\n"
           b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_BODY), _BODY))


class BoundedHead(HttpToolsProtocol):
    # Bytes received since the head being read began (a connection starts in one).
    _in_head, _head_bytes, _refused = True, 0, False

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes = False, 0
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:  # the head may end in this chunk: the parser says so (and starts counting anew)
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > MAX_HEAD_BYTES:
            self._refuse()

    def _refuse(self) -> None:
        self._refused = True
        self.transport.write(_ANSWER)
        asyncio.get_running_loop().call_later(LINGER_SECONDS, self.transport.close)
