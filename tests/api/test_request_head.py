"""A request's line and headers are bounded by the server `spotbroker serve`
runs: a connection sending a 200 MB header, before any token is checked,
held the event loop (every team's requests, the agents' reports) for 80 s,
since the parser copies a head as it grows, and took twice its size of memory."""
from __future__ import annotations

import re
import socket
import time
from urllib.parse import urlsplit

import pytest

from spotbroker.api.headlimit import MAX_HEAD_BYTES


def exchange(url: str, data: bytes) -> list[bytes]:
    """Send `data` on one connection; the status line of each answer, until the server closes it."""
    where = urlsplit(url)
    with socket.create_connection((where.hostname, where.port), timeout=20) as s:
        s.sendall(data)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return re.findall(rb"HTTP/1\.1 \d{3} [^\r]*", answer)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_request_head_over_the_bound_is_refused_at_once(server):
    big = b"a" * (4 * MAX_HEAD_BYTES)
    started = time.monotonic()
    assert exchange(server.url, b"GET /healthz HTTP/1.1\r\nConnection: close\r\nX-Big: " + big + b"\r\n\r\n") == [
        b"HTTP/1.1 431 Request Header Fields Too Large"]
    assert exchange(server.url, b"GET /healthz?" + big + b" HTTP/1.1\r\nConnection: close\r\n\r\n") == [
        b"HTTP/1.1 431 Request Header Fields Too Large"]
    assert time.monotonic() - started < 10
    # Heads within the bound, several on one connection, bodies of any size the route takes: as before.
    within = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Fill: " + b"b" * (MAX_HEAD_BYTES // 2) + b"\r\n\r\n"
    body = b"{" + b" " * (3 * MAX_HEAD_BYTES) + b"}"
    post = b"POST /v1/teams HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    assert exchange(server.url, within + post + within + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close"
                    b"\r\n\r\n") == [b"HTTP/1.1 200 OK", b"HTTP/1.1 401 Unauthorized", b"HTTP/1.1 200 OK",
                                     b"HTTP/1.1 200 OK"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_head_that_does_not_come_whole_in_time_is_a_408_and_closed(serve_process):
    """Connections that drip a head (a few bytes every 20 s) were held open
    forever, with no token: uvicorn's keep-alive timer stops at a request's
    first byte."""
    with serve_process(SPOTBROKER_HEAD_TIMEOUT_SECONDS="2") as server:
        where = urlsplit(server.url)
        drippers = []
        for _ in range(3):
            s = socket.create_connection((where.hostname, where.port), timeout=20)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-a: ")
            drippers.append(s)
        silent = socket.create_connection((where.hostname, where.port), timeout=20)  # sends nothing at all
        started = time.monotonic()
        time.sleep(1)
        for s in drippers:
            s.sendall(b"a")  # a byte now and then does not keep it
        for s in (*drippers, silent):
            answer = b""
            while chunk := s.recv(65536):  # until the server closes it
                answer += chunk
            s.close()
            assert answer.startswith(b"HTTP/1.1 408 Request Timeout") and b"2 s" in answer, answer
        assert time.monotonic() - started < 10
        # A head sent in parts within the time, and a connection that serves several requests: as before.
        with socket.create_connection((where.hostname, where.port), timeout=20) as s:
            for part in (b"GET /healthz HTTP/1.1\r\n", b"Host: x\r\n", b"\r\n"):
                s.sendall(part)
                time.sleep(0.5)
            time.sleep(2.5)  # idle between requests is uvicorn's keep-alive's to judge (5 s)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        assert re.findall(rb"HTTP/1\.1 \d{3} [^\r]*", answer) == [b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK"]
