"""The outermost checks every request passes, as plain ASGI middleware.

- A body larger than its route allows is refused with a 413 before it is
  read (from `Content-Length`), or as soon as it passes the limit (chunked),
  so a 10 MB body never sits in the server's memory.
- A body must come whole within SPOTBROKER_BODY_TIMEOUT_SECONDS of its
  request's head (an upload's stream is timed by its route, which keeps it on
  disk): past it, 408 and closed.
- A body sent to the API with no bearer token is dropped as it comes, and
  the route is given an empty one: FastAPI reads and parses a route's body
  before its dependencies (the token's check among them) run, so connections
  with no token each held a megabyte of a body they stalled in.
- The bodies one process holds at once (being read, or read and not yet
  answered) are bounded in all (SPOTBROKER_MAX_BODY_BYTES_IN_FLIGHT), and
  by holder: a team (the admin counts as one), an attempt's agent, or the
  requests with no token (the dashboard's forms) each hold at most a
  quarter of it (the anonymous ones `ANONYMOUS_SHARE`), though always one
  body at a time. Past either, 503 with Retry-After and closed. The holder
  is known before a byte of the body is read (`identify`): a token that
  names no one is answered 401 at once, so a body sent with any string for
  a token holds nothing (64 such heads that stalled once took the whole
  budget, and every team's and agent's posts got 503s).
- A client that hangs up before its body is read is no error: nothing is
  answered, and the log says so in one line.
- An exception no handler knows becomes a 500 problem document here, and is
  not raised further: Starlette's last-resort handler re-raises after its
  500, and uvicorn then closes the connection, so a client's next request on
  that keep-alive connection was reset.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from spotbroker.agent.code import MAX_ARCHIVE_BYTES

log = logging.getLogger("spotbroker.api")

DEFAULT_BODY_LIMIT = 1 << 20
# Larger bodies allowed on some routes, by path prefix: the agent ships log
# chunks of up to 4 MiB, and an upload route bounds its own archive as it streams.
BODY_LIMITS = {"/v1/agent/logs": (4 << 20) + 1, "/v1/uploads/": MAX_ARCHIVE_BYTES + 1,
               "/dashboard/": 16 << 10}  # the dashboard posts small forms only (its login: a token)


def body_limit(path: str) -> int:
    return next((limit for prefix, limit in BODY_LIMITS.items() if path.startswith(prefix)), DEFAULT_BODY_LIMIT)


# Routes that read their body as a stream and time it themselves (api/routers/uploads.py).
STREAMED = "/v1/uploads/"

ANONYMOUS = "anonymous"       # the holder of bodies sent with no bearer token (the dashboard's forms)
ANONYMOUS_SHARE = 1 << 20     # 64 logins' forms at once
# scope -> who holds its body: a holder's name, ANONYMOUS with no token, None for a token that names no one
Identify = Callable[[Scope], Awaitable[str | None]]


DATABASE_DOWN = "the database did not answer; try again shortly"  # a 503's detail (here and api/errors.py)


class BodyTooLarge(Exception):
    pass


class BodyTooSlow(Exception):
    pass


class Guard:
    def __init__(self, app: ASGIApp, body_timeout_s: float, max_in_flight: int = 64 << 20,
                 identify: Identify | None = None) -> None:
        self.app, self.body_timeout_s, self.max_in_flight = app, body_timeout_s, max_in_flight
        self.identify = identify
        self.in_flight = 0  # bytes of the bodies held now (one event loop: no lock)
        self.held_by: Counter[str] = Counter()
        self._said_full = -60.0

    def _room(self, holder: str, size: int) -> bool:
        """Whether `holder` may hold one more body of `size` bytes now."""
        share = ANONYMOUS_SHARE if holder == ANONYMOUS else self.max_in_flight // 4
        mine = self.held_by[holder]
        return self.in_flight + size <= self.max_in_flight and (not mine or mine + size <= share)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = body_limit(scope["path"])
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _send_problem(send, 413, "Payload too large", f"the body is at most {limit} bytes here",
                                close=True)
            return
        received, started, body_done = 0, False, False
        loop = asyncio.get_running_loop()
        streamed = scope["path"].startswith(STREAMED)  # to disk, by its route: not held here
        deadline = None if streamed else loop.time() + self.body_timeout_s

        async def counted_receive() -> Message:
            nonlocal received, body_done
            if body_done or deadline is None:  # (after the body, a receive waits for the client to go)
                message = await receive()
            else:
                try:
                    message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
                except TimeoutError:
                    raise BodyTooSlow(f"the body did not come whole in {self.body_timeout_s:g} s") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(f"the body is at most {limit} bytes here")
                body_done = not message.get("more_body", False)
            return message

        # No token: the body is read and dropped as it comes, and the route gets an empty one.
        dropping = scope["path"].startswith("/v1/") and _has_body(scope) and not bearer_token(scope)

        async def app_receive() -> Message:
            nonlocal dropping
            message = await counted_receive()
            if not dropping:
                return message
            dropping = False
            while message["type"] == "http.request" and message.get("more_body", False):
                message = await counted_receive()
            return {"type": "http.request", "body": b"", "more_body": False} \
                if message["type"] == "http.request" else message

        # What the body will hold, taken before it is read: its declared size, else the route's bound.
        held = 0 if dropping or streamed or not _has_body(scope) else (declared if declared is not None else limit)
        holder = ANONYMOUS
        if held and self.identify is not None and bearer_token(scope):
            try:
                holder = await self.identify(scope)
            except Exception as exc:  # (the database, asked who the token is): as a route answers it
                log.warning("%s %s: the database did not answer: %s", scope.get("method"), scope.get("path"),
                            str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)
                await _send_problem(send, 503, "Service unavailable", DATABASE_DOWN, close=True, retry_after=5)
                return
            if holder is None:  # the route would say the same: nothing of the body is read
                await _send_problem(send, 401, "Unauthorized", "unknown or revoked token", close=True,
                                    headers=[(b"www-authenticate", b"Bearer")])
                return
        if held and not self._room(holder, held):
            if loop.time() - self._said_full >= 60:  # said once a minute, not once per refused request
                self._said_full = loop.time()
                log.warning("request bodies refused (503): this server holds SPOTBROKER_MAX_BODY_BYTES_IN_FLIGHT "
                            "(%d bytes) of them, a quarter at most for one team or agent", self.max_in_flight)
            await _send_problem(send, 503, "Service unavailable", "the server holds as many request bodies as it "
                                "may now: try again shortly", close=True, retry_after=5)
            return
        self.in_flight += held
        self.held_by[holder] += held

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, app_receive, watched_send)
        except BodyTooLarge:
            if not started:
                await _send_problem(send, 413, "Payload too large", f"the body is at most {limit} bytes here",
                                    close=True)
        except BodyTooSlow as exc:
            log.info("%s %s: %s", scope.get("method"), scope.get("path"), exc)
            if not started:
                await _send_problem(send, 408, "Request timeout", str(exc), close=True)
        except ClientDisconnect:  # nobody is left to answer, and nothing failed
            log.info("%s %s: the client hung up before its request was read", scope.get("method"), scope.get("path"))
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await _send_problem(send, 500, "Internal error", "the server failed; see its log")
        finally:
            self.in_flight -= held
            self.held_by[holder] -= held
            if not self.held_by[holder]:
                del self.held_by[holder]


def _has_body(scope: Scope) -> bool:
    declared = _content_length(scope)
    return bool(declared) or any(name == b"transfer-encoding" for name, _ in scope.get("headers", ()))


def bearer_token(scope: Scope) -> str | None:
    """The request's bearer token, if it sends one."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            token = token.strip()
            return token.decode("latin-1") if scheme.lower() == b"bearer" and token else None
    return None


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_problem(send: Send, status: int, title: str, detail: str, close: bool = False,
                        retry_after: int | None = None, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"type": "about:blank", "title": title, "status": status, "detail": detail}).encode()
    headers = [(b"content-type", b"application/problem+json"), (b"content-length", str(len(body)).encode()),
               *(headers or [])]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    if close:  # the unread rest of the body would be taken for the next request
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
