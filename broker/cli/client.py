"""A small HTTP client for the broker's REST API, used by the CLI, the demo
and the benchmarks. Errors come back as `ApiError` with the server's
problem+json detail (and each field error) in the message."""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import httpx


class ApiError(Exception):
    def __init__(self, status: int, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.body = status, body or {}


def unreachable(url: object, exc: Exception, verb: str = "cannot reach") -> ApiError:
    """The address comes from SPOTBROKER_URL: say so, or a broker on another
    port looks like a broker that is down."""
    return ApiError(0, f"{verb} the broker at {url} (SPOTBROKER_URL): {exc}")


def _parts(archive: BinaryIO, sent: Callable[[int], None], part: int = 1 << 20) -> Iterator[bytes]:
    total = 0
    while chunk := archive.read(part):
        yield chunk
        total += len(chunk)
        sent(total)


class Client:
    def __init__(self, url: str, token: str | None, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self, r: httpx.Response) -> httpx.Response:
        if r.status_code < 400:
            return r
        try:
            body = r.json()
        except ValueError:
            raise ApiError(r.status_code, f"HTTP {r.status_code}: {r.text[:200]}") from None
        message = body.get("detail") or body.get("title") or f"HTTP {r.status_code}"
        for err in body.get("errors") or []:
            message += f"\n  {err.get('field')}: {err.get('message')}"
        raise ApiError(r.status_code, message, body)

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return self._check(self.http.request(method, path, **kw))
        except httpx.TransportError as exc:
            raise unreachable(self.http.base_url, exc) from None

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        return self._submit({"json": spec}, idempotency_key)

    def submit_yaml(self, text: bytes, idempotency_key: str | None = None) -> dict[str, Any]:
        return self._submit({"content": text, "headers": {"Content-Type": "application/yaml"}}, idempotency_key)

    def _submit(self, body: dict[str, Any], key: str | None, tries: int = 3) -> dict[str, Any]:
        """Retried on connection errors under one idempotency key, so a
        request whose answer was lost never creates a second job."""
        key = key or uuid.uuid4().hex
        headers = {**body.pop("headers", {}), "Idempotency-Key": key}
        for attempt in range(tries):
            try:
                return self._check(self.http.post("/v1/jobs", headers=headers, **body)).json()
            except httpx.TransportError as exc:
                if attempt == tries - 1:
                    raise unreachable(self.http.base_url, exc) from None
                time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")

    def upload(self, archive: BinaryIO, sha256: str, size: int | None = None,
               sent: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Send a workdir archive (`PUT /v1/uploads/{sha256}`), unless the team
        has it already; its {"sha256", "bytes"}. A job then names it:
        `workdir: {"upload": sha256}`. With its `size`, `sent(bytes)` is told
        of each part as it goes."""
        try:
            return self._check(self.http.get(f"/v1/uploads/{sha256}")).json()
        except ApiError as exc:
            if exc.status != 404:
                raise
        except httpx.TransportError as exc:
            raise unreachable(self.http.base_url, exc) from None
        headers = {"Content-Type": "application/gzip"}
        content: Any = archive
        if size is not None and sent is not None:
            headers["Content-Length"] = str(size)  # declared: the broker checks the quota before the body
            content = _parts(archive, sent)
        return self._request("PUT", f"/v1/uploads/{sha256}", content=content, headers=headers, timeout=600).json()

    def jobs(self, states: list[str] | None = None, limit: int = 50,
             cursor: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if states:
            params["state"] = states
        if cursor:
            params["cursor"] = cursor
        return self._request("GET", "/v1/jobs", params=params).json()

    def job(self, job_id: int) -> dict[str, Any]:
        return self._request("GET", f"/v1/jobs/{job_id}").json()

    def events(self, job_id: int) -> list[dict[str, Any]]:
        """All the job's events, page after page."""
        found: list[dict[str, Any]] = []
        after: int | None = None
        while True:
            page = self._request("GET", f"/v1/jobs/{job_id}/events",
                                 params={} if after is None else {"after": after}).json()
            found += page["events"]
            after = page.get("next_after")
            if after is None:
                return found

    def logs(self, job_id: int, tail: int | None = None, attempt: int | None = None, node: int | None = None) -> str:
        params = {k: v for k, v in {"tail": tail, "attempt": attempt, "node": node}.items() if v is not None}
        return self._request("GET", f"/v1/jobs/{job_id}/logs", params=params).text

    def follow_logs(self, job_id: int, tail: int | None = None, node: int | None = None,
                    attempt: int | None = None) -> Iterator[str]:
        """The job's output across its attempts until it ends (with `attempt`:
        that attempt's, until it ends), as the server streams it."""
        params: dict[str, Any] = {"follow": "true"}
        params.update({k: v for k, v in {"tail": tail, "node": node, "attempt": attempt}.items() if v is not None})
        try:
            with self.http.stream("GET", f"/v1/jobs/{job_id}/logs", params=params, timeout=None) as r:
                if r.status_code >= 400:
                    r.read()
                    self._check(r)
                yield from r.iter_text()
        except httpx.TransportError as exc:
            raise unreachable(self.http.base_url, exc, "lost") from None

    def cancel(self, job_id: int) -> dict[str, Any]:
        return self._request("POST", f"/v1/jobs/{job_id}/cancel").json()

    def checkpoints(self, job_id: int) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        cursor = None
        while True:
            page = self._request("GET", f"/v1/jobs/{job_id}/checkpoints",
                                 params={"cursor": cursor} if cursor else None).json()
            found += page["checkpoints"]
            if not (cursor := page.get("next_cursor")):
                return found

    def metrics(self, job_id: int) -> dict[str, Any]:
        return self._request("GET", f"/v1/jobs/{job_id}/metrics").json()

    def simulate_preemption(self, job_id: int) -> dict[str, Any]:
        return self._request("POST", f"/v1/jobs/{job_id}/simulate-preemption").json()

    def create_team(self, name: str) -> dict[str, Any]:
        return self._request("POST", "/v1/teams", json={"name": name}).json()

    def whoami(self) -> dict[str, Any]:
        return self._request("GET", "/v1/whoami").json()

    def costs(self, team: str, since: str | None = None, until: str | None = None,
              group_by: str | None = None) -> dict[str, Any]:
        params = {k: v for k, v in {"since": since, "until": until, "group_by": group_by}.items() if v}
        return self._request("GET", f"/v1/teams/{team}/costs", params=params).json()

    def costs_csv(self, team: str, since: str | None = None, until: str | None = None,
                  group_by: str | None = None) -> str:
        params = {k: v for k, v in {"since": since, "until": until, "group_by": group_by}.items() if v}
        return self._request("GET", f"/v1/teams/{team}/costs.csv", params=params).text

    def budget(self, team: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/teams/{team}/budget").json()

    def set_budget(self, team: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("PUT", f"/v1/teams/{team}/budget", json=body).json()

    def storage(self, team: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/teams/{team}/storage").json()

    def set_storage(self, team: str, buckets: list[dict[str, Any]]) -> dict[str, Any]:
        return self._request("PUT", f"/v1/teams/{team}/storage", json={"buckets": buckets}).json()

    def alerts(self, **params: Any) -> dict[str, Any]:
        return self._request("GET", "/v1/alerts", params={k: v for k, v in params.items() if v is not None}).json()
