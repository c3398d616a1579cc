"""A request's body, before any token is checked: FastAPI reads and parses a
route's body before its dependencies (the token among them) run, and nothing
timed a body. Connections with no token, each sending 1 MB of a 1,000,001-byte
body to `POST /v1/teams` and then stalling, were all held open, each holding
its megabyte (100 of them: +86 MB)."""
from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import ADMIN_TOKEN


def _answer(s: socket.socket) -> bytes:
    answer = b""
    while chunk := s.recv(65536):  # until the server closes it
        answer += chunk
    return answer


def _post(path: str, body: bytes, declared: int, token: str | None = None) -> bytes:
    auth = b"" if token is None else b"Authorization: Bearer %s\r\n" % token.encode()
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
            % (path.encode(), auth, declared, body))


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_body_with_no_token_is_not_read_and_one_that_stalls_is_cut_off(serve_process):
    with serve_process(SPOTBROKER_BODY_TIMEOUT_SECONDS="2") as server:
        where = urlsplit(server.url)

        def connect() -> socket.socket:
            return socket.create_connection((where.hostname, where.port), timeout=20)

        # No token: the body is not read as JSON (a 401, not a 422 about the JSON), and the
        # connection serves the next request.
        with connect() as s:
            then = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            s.sendall(_post("/v1/teams", b'{"a":', 5) + then)
            answer = _answer(s)
        assert answer.startswith(b"HTTP/1.1 401 Unauthorized"), answer
        assert b"HTTP/1.1 200 OK" in answer

        # Stalled bodies, with no token and with one, on routes that read their body whole:
        # each is answered 408 and closed when its time is up.
        team = httpx.post(server.url + "/v1/teams", json={"name": "ml"},
                          headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()["token"]
        stalled = [connect() for _ in range(4)]
        started = time.monotonic()
        stalled[0].sendall(_post("/v1/teams", b'{"name": "' + b"a" * 100_000, 1_000_001))
        stalled[1].sendall(_post("/v1/agent/events", b"[" * 1000, 1_000_001))
        stalled[2].sendall(_post("/v1/teams", b'{"name": "x', 1000, token=ADMIN_TOKEN))
        stalled[3].sendall(_post("/v1/jobs", b'{"run": "', 1000, token=team))  # (a route that reads its own body)
        for s in stalled:
            answer = _answer(s)
            s.close()
            assert answer.startswith(b"HTTP/1.1 408 Request Timeout") and b"2 s" in answer, answer
        assert time.monotonic() - started < 10
        assert "Traceback" not in server.output()

        # A body that comes whole in time, in parts: as before.
        with connect() as s:
            body = b'{"name": "body-in-parts"}'
            s.sendall(_post("/v1/teams", body[:5], len(body), token=ADMIN_TOKEN))
            time.sleep(1)
            s.sendall(body[5:])
            head = s.recv(65536)
        assert head.startswith(b"HTTP/1.1 201 Created"), head


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_bodies_held_at_once_are_bounded_and_a_token_that_names_no_one_holds_none(serve_process):
    """800 connections each stalling in a megabyte of body took the broker
    from 371 MB to 1 GB; then, bounded in all, 64 heads that stalled with any
    string for a token took the whole budget, and every team's posts and every
    agent's heartbeat got 503s (a running job was taken for vanished). A token
    that names no one is now answered 401 on its head; a team holds at most a
    quarter of the budget (one body always), the forms sent with no token
    their own small share."""
    with serve_process(SPOTBROKER_BODY_TIMEOUT_SECONDS="5", SPOTBROKER_MAX_BODY_BYTES_IN_FLIGHT=str(8 << 20)) as server:
        where = urlsplit(server.url)

        def connect() -> socket.socket:
            return socket.create_connection((where.hostname, where.port), timeout=20)

        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        team = httpx.post(server.url + "/v1/teams", json={"name": "b"}, headers=admin).json()["token"]
        # Heads with a token that names no one, far past the whole budget: each 401 at once, none held.
        junk = []
        for i in range(20):
            s = connect()
            path, token = ("/v1/teams", f"not-a-token-{i}") if i % 2 else ("/v1/agent/events", f"sba_not-{i}")
            s.sendall(_post(path, b"", 1_000_001, token=token))
            junk.append(s)
        for s in junk:
            answer = _answer(s)
            s.close()
            assert answer.startswith(b"HTTP/1.1 401") and b"www-authenticate: bearer" in answer.lower(), answer[:300]
        # A team's own stalled bodies: at most a quarter of the budget (2 MiB), one body always.
        stalled = []
        for _ in range(2):
            s = connect()
            s.sendall(_post("/v1/jobs", b"a" * 1_000_000, 1_000_001, token=team))
            stalled.append(s)
        time.sleep(1)
        with connect() as s:  # its third is refused on its head: never held
            s.sendall(_post("/v1/jobs", b"", 1_000_001, token=team))
            answer = _answer(s)
        assert answer.startswith(b"HTTP/1.1 503") and b"retry-after: 5" in answer.lower(), answer[:300]
        # Another holder is served meanwhile, body and all.
        made = httpx.post(server.url + "/v1/teams", json={"name": "after"}, headers=admin)
        assert made.status_code == 201, made.text
        assert httpx.get(server.url + "/healthz").status_code == 200
        for s in stalled:  # each is cut off at its time (408), which frees what it held
            assert _answer(s).startswith(b"HTTP/1.1 408")
            s.close()
        freed = httpx.post(server.url + "/v1/jobs", json={"run": "true", "num_nodes": 9},  # (held: never runs)
                           headers={"Authorization": f"Bearer {team}"})
        assert freed.status_code == 201, freed.text
        # the dashboard's forms are small: a login body is at most 16 KiB
        big = httpx.post(server.url + "/dashboard/login", content=b"token=" + b"a" * (32 << 10),
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert big.status_code == 413
        assert "Traceback" not in server.output()
