"""The attempt's storage credentials on the node, kept fresh for the trainer.

The broker launches a node with credentials scoped to its job (the
provider's standard variables, `AWS_ACCESS_KEY_ID`... for S3, and
`SPOTBROKER_STORAGE_PROVIDER` / `SPOTBROKER_STORAGE_EXPIRES_AT`). They end
(an STS session lasts an hour by default) while training goes on for days.
The trainer's checkpoint library runs in another process, without the
agent's token, so the agent:

1. writes them to `storage-credentials.json` in the trainer's control
   directory (mode 0600: the trainer's own user) before the trainer starts,
   and names the file in the trainer's `SPOTBROKER_STORAGE_CREDENTIALS_FILE`;
2. asks the broker for fresh ones (`POST /v1/agent/credentials` with its
   token) `REFRESH_LEAD` seconds before they end, and replaces the file
   atomically; on failure it tries again every `RETRY_SECONDS` until they
   have ended.

The library's storage (`agent/checkpoint/storage.py`) reads the file through
obstore's credential provider whenever obstore's cached credentials come
within five minutes of their end, so it always finds fresh ones there.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spotbroker.agent import protocol

log = logging.getLogger("spotbroker.agent")

# Before the end of the credentials held, when fresh ones are asked for:
# more than obstore's own five-minute margin, so the file is fresh by the
# time obstore reads it again. (STS sessions last at least 15 minutes.)
REFRESH_LEAD = 600.0
RETRY_SECONDS = 15.0
# Each provider's standard variables -> obstore's credential fields.
ENV_FIELDS = {"s3": {"AWS_ACCESS_KEY_ID": "access_key_id", "AWS_SECRET_ACCESS_KEY": "secret_access_key",
                     "AWS_SESSION_TOKEN": "token"},
              "gs": {"GOOGLE_BEARER_TOKEN": "token"}}


class CredentialsError(ValueError):
    """What the broker or the environment gave is not a credentials document."""


def parse(document: Mapping[str, Any]) -> tuple[str, datetime, dict[str, str]]:
    """(provider, expires_at, credentials) of a credentials document."""
    try:
        provider = str(document["provider"])
        expires = datetime.fromisoformat(str(document["expires_at"]))
        credentials = {str(k): str(v) for k, v in dict(document["credentials"]).items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise CredentialsError(f"not a credentials document ({type(exc).__name__}: {exc})") from None
    if expires.tzinfo is None:
        expires = expires.replace(tzinfo=UTC)
    return provider, expires, credentials


def write(path: Path, document: Mapping[str, Any]) -> None:
    """Replace the credentials file atomically (a reader sees the old or the new one), 0600."""
    temp = path.with_name(f".{path.name}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(document, f)
    os.replace(temp, path)


def from_env(env: Mapping[str, str]) -> dict[str, Any] | None:
    """The launch's credentials as a document, or None when the launch gave none."""
    provider = env.get(protocol.ENV_STORAGE_PROVIDER)
    if not provider:
        return None
    fields = ENV_FIELDS.get(provider)
    if fields is None:
        raise CredentialsError(f"credentials for {provider!r}, which this agent does not know")
    credentials = {field: env[name] for name, field in fields.items() if env.get(name)}
    document = {"provider": provider, "expires_at": env.get(protocol.ENV_STORAGE_EXPIRES_AT, ""),
                "credentials": credentials}
    parse(document)
    return document


class FileCredentials:
    """obstore's credential provider over the credentials file: the file is
    read on every call (obstore calls again only when the credentials it
    holds come within five minutes of their end)."""

    def __init__(self, path: str, provider: str) -> None:
        self.path = path
        self.provider = provider

    def __call__(self) -> dict[str, Any]:
        with open(self.path) as f:
            provider, expires_at, credentials = parse(json.load(f))
        if provider != self.provider:
            raise CredentialsError(f"{self.path} holds {provider} credentials, not {self.provider}")
        return {**credentials, "expires_at": expires_at}


def credential_provider(provider: str) -> dict[str, Any]:
    """The storage's `credential_provider` option on a node whose agent keeps
    a credentials file (empty elsewhere: obstore's own environment then)."""
    path = os.environ.get(protocol.ENV_STORAGE_CREDENTIALS_FILE)
    return {"credential_provider": FileCredentials(path, provider)} if path else {}


class CredentialsKeeper:
    """Keeps one credentials file fresh. `fetch()` returns a fresh document
    from the broker (the agent's client); `clock()` is the time now, UTC."""

    def __init__(self, path: Path, document: Mapping[str, Any], lead: float = REFRESH_LEAD,
                 retry: float = RETRY_SECONDS, clock: Callable[[], datetime] | None = None) -> None:
        self.path = path
        self.lead = lead
        self.retry = retry
        self.clock = clock or (lambda: datetime.now(UTC))
        self.expires_at = parse(document)[1]
        write(path, document)

    @classmethod
    def start_for(cls, control_dir: Path | None, env: dict[str, str], **kwargs: Any) -> CredentialsKeeper | None:
        """The keeper of the launch's credentials, its file written and named
        in `env` (the trainer's environment); None when the launch gave none."""
        try:
            document = from_env(env)
        except CredentialsError as exc:
            log.error("the launch's storage credentials are unusable: %s", exc)
            return None
        if document is None or control_dir is None:
            return None
        keeper = cls(control_dir / protocol.CREDENTIALS_FILE, document, **kwargs)
        env[protocol.ENV_STORAGE_CREDENTIALS_FILE] = str(keeper.path)
        return keeper

    def due_in(self) -> float:
        """Seconds until fresh credentials should be asked for (<= 0: now)."""
        return (self.expires_at - self.clock()).total_seconds() - self.lead

    def refresh(self, fetch: Callable[[], Mapping[str, Any]]) -> None:
        """Ask for fresh credentials and put them in the file; raises on failure."""
        document = fetch()
        expires = parse(document)[1]
        write(self.path, document)
        self.expires_at = expires
        log.info("storage credentials renewed until %s", expires.isoformat(timespec="seconds"))

    def run(self, fetch: Callable[[], Mapping[str, Any]], stop: threading.Event,
            gone: tuple[type[BaseException], ...] = ()) -> None:
        """Refresh before every end until `stop` is set, or until `fetch`
        raises one of `gone` (the broker ended the attempt). Requests are at
        least `retry` seconds apart, whatever the lead and the lifetime."""
        wait = max(0.0, self.due_in())
        while not stop.wait(wait):
            try:
                self.refresh(fetch)
            except gone:
                return
            except Exception as exc:  # the broker is down or refused: the held ones may still last
                left = (self.expires_at - self.clock()).total_seconds()
                log.warning("could not renew the storage credentials (%s; %.0f s left): retrying", exc, left)
            wait = max(self.retry, self.due_in())
