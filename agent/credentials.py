"""The attempt's storage credentials on the node, kept fresh for the trainer.

The broker launches a node with credentials scoped to its job: a document
(`protocol.ENV_STORAGE_CREDENTIALS`, JSON: the provider, when they end, the
checkpoint bucket, where it is, and obstore's credential fields). They are
spotbroker's own: the provider's standard variables (`AWS_ACCESS_KEY_ID`,
`GOOGLE_APPLICATION_CREDENTIALS`...) stay the user's, so a trainer that reads
its dataset with its own keys or the node's instance identity keeps doing so.
They end (an STS session lasts an hour by default) while training goes on for
days. The trainer's checkpoint library runs in another process, without the
agent's token, so the agent:

1. writes the document to `storage-credentials.json` in the trainer's control
   directory (mode 0600: the trainer's own user) before the trainer starts,
   names the file in the trainer's `SPOTBROKER_STORAGE_CREDENTIALS_FILE` and
   leaves the launch's variable out of the trainer's environment;
2. asks the broker for fresh ones (`POST /v1/agent/credentials` with its
   token) `REFRESH_LEAD` seconds before they end, and replaces the file
   atomically; on failure it tries again every `RETRY_SECONDS` until they
   have ended.

The library's storage (`agent/checkpoint/storage.py`) uses them for the
document's bucket only (`node_store`), through obstore's credential provider,
which reads the file again whenever obstore's cached credentials come within
five minutes of their end, so it always finds fresh ones there. Before the
agent runs (a SkyPilot node's code fetch) it reads the launch's variable.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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


class CredentialsError(ValueError):
    """What the broker or the environment gave is not a credentials document."""


@dataclass(frozen=True)
class Document:
    """A credentials document, parsed (`credentials` is secret: out of the repr)."""

    provider: str                # s3 | gs | az
    expires_at: datetime
    bucket: str                  # the checkpoint root's bucket (Azure: container): the only one they are for
    options: dict[str, str]      # where it is: endpoint, region, account (none: the provider's default)
    credentials: dict[str, str] = field(repr=False)


def parse(document: Mapping[str, Any]) -> Document:
    """A credentials document, checked."""
    try:
        provider = str(document["provider"])
        expires = datetime.fromisoformat(str(document["expires_at"]))
        bucket = str(document["bucket"])
        options = {str(k): str(v) for k, v in dict(document.get("options") or {}).items()}
        credentials = {str(k): str(v) for k, v in dict(document["credentials"]).items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise CredentialsError(f"not a credentials document ({type(exc).__name__}: {exc})") from None
    if expires.tzinfo is None:
        expires = expires.replace(tzinfo=UTC)
    return Document(provider, expires, bucket, options, credentials)


def write(path: Path, document: Mapping[str, Any]) -> None:
    """Replace the credentials file atomically (a reader sees the old or the new one), 0600."""
    temp = path.with_name(f".{path.name}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(document, f)
    os.replace(temp, path)


def from_env(env: Mapping[str, str]) -> dict[str, Any] | None:
    """The launch's credentials document, or None when the launch gave none."""
    raw = env.get(protocol.ENV_STORAGE_CREDENTIALS)
    if not raw:
        return None
    try:
        document = json.loads(raw)
    except ValueError:
        raise CredentialsError(f"{protocol.ENV_STORAGE_CREDENTIALS} is not JSON") from None
    if not isinstance(document, dict):
        raise CredentialsError(f"{protocol.ENV_STORAGE_CREDENTIALS} is not a credentials document")
    parse(document)
    return document


def held() -> dict[str, Any] | None:
    """The attempt's credentials document in this process: the agent's file
    (kept fresh), else the launch's variable (before the agent runs); None
    off a node, or on a node whose root needs none (file://)."""
    path = os.environ.get(protocol.ENV_STORAGE_CREDENTIALS_FILE)
    if path:
        with open(path) as f:
            return json.load(f)
    return from_env(os.environ)


class NodeCredentials:
    """obstore's credential provider over the held document: read again on
    every call (obstore calls again only when the credentials it holds come
    within five minutes of their end). Azure's: the SAS token of one place."""

    def __init__(self, provider: str, place: str | None = None) -> None:
        self.provider = provider
        self.place = place

    def __call__(self) -> dict[str, Any]:
        document = held()
        if document is None:
            raise CredentialsError("the attempt's storage credentials are gone from this process")
        held_now = parse(document)
        if held_now.provider != self.provider:
            raise CredentialsError(f"the held credentials are for {held_now.provider}, not {self.provider}")
        if self.place is None:
            return {**held_now.credentials, "expires_at": held_now.expires_at}
        if self.place not in held_now.credentials:
            raise CredentialsError(f"the held credentials have no token for {self.place}")
        return {"sas_token": held_now.credentials[self.place], "expires_at": held_now.expires_at}


def node_store(scheme: str, bucket: str) -> Document | None:
    """The held document when `bucket` is the attempt's own checkpoint bucket
    (on a node launched with its scoped credentials): where the bucket is and
    what the credentials are for; the store reads the credentials themselves
    through `NodeCredentials`. None for any other bucket (the user's own
    data, read with the user's own credentials) and off a node."""
    document = held()
    if document is None:
        return None
    given = parse(document)
    # Besides the checkpoint bucket, the buckets the job's file mounts name, which the broker scoped them to.
    others = [b for b in given.options.get("buckets", "").split(",") if b]
    return given if given.provider == scheme and (bucket == given.bucket or bucket in others) else None


class CredentialsKeeper:
    """Keeps one credentials file fresh. `fetch()` returns a fresh document
    from the broker (the agent's client); `clock()` is the time now, UTC."""

    def __init__(self, path: Path, document: Mapping[str, Any], lead: float = REFRESH_LEAD,
                 retry: float = RETRY_SECONDS, clock: Callable[[], datetime] | None = None) -> None:
        self.path = path
        self.lead = lead
        self.retry = retry
        self.clock = clock or (lambda: datetime.now(UTC))
        self.expires_at = parse(document).expires_at
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
        del env[protocol.ENV_STORAGE_CREDENTIALS]  # the file is the trainer's one source: kept fresh
        return keeper

    def due_in(self) -> float:
        """Seconds until fresh credentials should be asked for (<= 0: now)."""
        return (self.expires_at - self.clock()).total_seconds() - self.lead

    def refresh(self, fetch: Callable[[], Mapping[str, Any]]) -> None:
        """Ask for fresh credentials and put them in the file; raises on failure."""
        document = fetch()
        expires = parse(document).expires_at
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
