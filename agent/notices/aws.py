"""AWS IMDSv2: ``spot/instance-action`` (the 2-minute notice) and
``events/recommendations/rebalance``; one session token shared by both,
refreshed before it expires and fetched again on a 401; 404 = nothing yet."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from spotbroker.agent.notices.watcher import (
    PREEMPTION,
    REBALANCE,
    MetadataError,
    Notice,
    WatchConfig,
    Watcher,
    json_object,
    metadata_client,
    parse_iso,
)

AWS_TOKEN_PATH = "/latest/api/token"
AWS_TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
AWS_TOKEN_HEADER = "X-aws-ec2-metadata-token"
AWS_INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
AWS_REBALANCE = "/latest/meta-data/events/recommendations/rebalance"
AWS_ACTIONS = frozenset({"terminate", "stop", "hibernate"})


class ImdsToken:
    """One IMDSv2 session token, shared by the AWS watchers; refreshed before expiry."""

    def __init__(self, base_url: str, config: WatchConfig) -> None:
        self.config = config
        self.fetches = 0
        self._client = metadata_client(base_url, config.request_timeout)
        self._lock = threading.Lock()
        self._token: str | None = None
        self._expires = 0.0  # monotonic

    def get(self) -> str:
        with self._lock:
            if self._token is None or time.monotonic() >= self._expires - self._margin():
                self._token, self._expires = self._fetch()
            return self._token

    def invalidate(self, token: str) -> None:
        """Drop `token` after a 401 (unless another thread already replaced it)."""
        with self._lock:
            if self._token == token:
                self._token = None

    def close(self) -> None:
        self._client.close()

    def _margin(self) -> float:
        # A short TTL (tests) must still leave the token some life before a refresh.
        return min(self.config.aws_token_margin, self.config.aws_token_ttl / 4)

    def _fetch(self) -> tuple[str, float]:
        ttl = self.config.aws_token_ttl
        started = time.monotonic()
        answer = self._client.put(AWS_TOKEN_PATH, headers={AWS_TOKEN_TTL_HEADER: str(ttl)})
        if answer.status_code != 200:
            raise MetadataError(f"IMDSv2 token request: HTTP {answer.status_code}")
        token = answer.text.strip()
        # The body is a secret: check it, never log it.
        if not token or len(token) > 512 or not (token.isascii() and token.isprintable()) or " " in token:
            raise MetadataError(f"IMDSv2 token request: unusable token ({len(answer.content)} bytes)")
        granted = answer.headers.get(AWS_TOKEN_TTL_HEADER, str(ttl))
        try:
            ttl = int(granted)
        except ValueError:
            pass
        self.fetches += 1
        return token, started + ttl


class AwsWatcher(Watcher):
    """Polls one IMDSv2 path; 404 means nothing yet."""

    cloud = "aws"

    def __init__(self, path: str, token: ImdsToken, base_url: str,
                 on_notice: Callable[[Notice], None], config: WatchConfig) -> None:
        super().__init__(base_url, on_notice, config)
        self.path = path
        self.token = token
        self.name = "aws." + ("instance-action" if path == AWS_INSTANCE_ACTION else "rebalance")

    def poll(self) -> list[Notice]:
        answer = self._get()
        if answer.status_code == 404:
            return []
        if answer.status_code != 200:
            raise MetadataError(f"{self.path}: HTTP {answer.status_code}")
        payload = json_object(answer, self.path)
        if self.path == AWS_INSTANCE_ACTION:
            return [self._instance_action(payload)]
        return [self._rebalance(payload)]

    def _get(self) -> httpx.Response:
        token = self.token.get()
        answer = self.client.get(self.path, headers={AWS_TOKEN_HEADER: token})
        if answer.status_code == 401:  # expired or revoked early: one fresh token, one retry
            self.token.invalidate(token)
            answer = self.client.get(self.path, headers={AWS_TOKEN_HEADER: self.token.get()})
        return answer

    def _instance_action(self, payload: dict[str, Any]) -> Notice:
        action = payload.get("action")
        if action not in AWS_ACTIONS:
            raise MetadataError(f"{self.path}: unknown action {action!r}")
        return Notice("aws", self.name, PREEMPTION, parse_iso(payload.get("time"), self.path), payload)

    def _rebalance(self, payload: dict[str, Any]) -> Notice:
        parse_iso(payload.get("noticeTime"), self.path)  # validates the shape
        return Notice("aws", self.name, REBALANCE, None, payload)


def probe(client: httpx.Client) -> bool:
    answer = client.put(AWS_TOKEN_PATH, headers={AWS_TOKEN_TTL_HEADER: "60"})
    return answer.status_code == 200 and bool(answer.text.strip())
