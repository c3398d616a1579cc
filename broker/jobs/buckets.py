"""The buckets a team's jobs may mount besides its own storage: a list the
admin keeps per team (`PUT /v1/teams/{team}/storage`), each a URI prefix and
whether the team may only read it.

The broker is SkyPilot's client and mints its nodes' credentials: a bucket
it was not told a team may use would reach a tenant's node with the
broker's identity. So a job mounts its team's own storage (under the
checkpoint root), a bucket by name (kept there too), or a prefix on this
list, and nothing else (`mounts.py`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from spotbroker.broker.store.models import Team, TeamBucket

MAX_BUCKETS = 100
_PREFIX_RE = re.compile(r"^(s3|gs|az)://[a-z0-9][a-z0-9._-]{1,254}(/[^?#]*)?\Z")
_WILDCARDS = re.compile(r"[*?\\]|\$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Allowed:
    uri: str          # a prefix, ending with '/'
    read_only: bool

    def holds(self, uri: str) -> bool:
        return f"{uri.rstrip('/')}/".startswith(self.uri)


def normalized(uri: str) -> str:
    """`uri` as a prefix ending with '/', or ValueError saying why it is no bucket prefix."""
    uri = uri.strip()
    if _CONTROL.search(uri):  # no object key holds one; in a listing or a log line it would forge another
        raise ValueError("a bucket URI may not hold control characters (NUL, newline, ...)")
    if not _PREFIX_RE.match(uri):
        raise ValueError(f"{uri!r} is not a bucket URI (s3://BUCKET[/PREFIX], gs://, az://)")
    path = uri.split("://", 1)[1]
    if _WILDCARDS.search(path) or any(part in (".", "..") for part in path.rstrip("/").split("/")) \
            or "//" in path.rstrip("/"):
        raise ValueError(f"{uri!r}: give the prefix itself, without '*', '?', '$', '.', '..' or empty parts")
    return f"{uri.rstrip('/')}/"


class BucketIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    uri: Annotated[str, Field(max_length=1000, description="s3://BUCKET[/PREFIX], gs://... or az://...")]
    read_only: bool = Field(False, description="the team's nodes may read it, never write")

    @field_validator("uri")
    @classmethod
    def _uri(cls, value: str) -> str:
        return normalized(value)


class StorageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    buckets: Annotated[list[BucketIn], Field(max_length=MAX_BUCKETS, description=(
        "the whole list: it replaces what the team had"))]


def outside_credentials(uri: str, checkpoint_root: str) -> str | None:
    """Why nodes could not get credentials for `uri` (None: they can): the
    broker mints them for its checkpoint root's storage alone, and on Azure
    in its container alone (a directory SAS per mount)."""
    scheme, _, rest = checkpoint_root.partition("://")
    if not uri.startswith(f"{scheme.lower()}://"):
        return (f"{uri!r}: this broker's nodes get credentials for {scheme.lower()}:// storage only (its storage "
                f"is {checkpoint_root})")
    container = rest.split("/", 1)[0]
    if scheme.lower() == "az" and uri.split("://", 1)[1].split("/", 1)[0] != container:
        return f"{uri!r}: on Azure, nodes get directory SAS tokens in the broker's container ({container}) only"
    return None


def overlap_error(buckets: list[BucketIn], checkpoint_root: str) -> list[dict[str, str]]:
    """Entries that touch the broker's checkpoint root (every team's
    checkpoints, code and buckets are there: a team gets its own part of
    it by itself), that lie in another storage than the root's (nodes get
    credentials for the root's alone: a mount there was refused only at a
    job's submission), or that repeat one another, as field errors."""
    root = f"{checkpoint_root.rstrip('/')}/"
    errors, seen = [], set()
    for i, bucket in enumerate(buckets):
        if (why := outside_credentials(bucket.uri, checkpoint_root)) is not None:
            errors.append({"field": f"buckets.{i}.uri", "message": why})
        if bucket.uri.startswith(root) or root.startswith(bucket.uri):
            errors.append({"field": f"buckets.{i}.uri", "message": (
                f"{bucket.uri} overlaps the broker's checkpoint root {root}, which holds every team's "
                "checkpoints: a team mounts its own part of it without being listed")})
        if bucket.uri in seen:
            errors.append({"field": f"buckets.{i}.uri", "message": f"{bucket.uri} is listed twice"})
        seen.add(bucket.uri)
    return errors


def allowed(session: Session, team_id: int) -> list[Allowed]:
    rows = session.scalars(select(TeamBucket).where(TeamBucket.team_id == team_id).order_by(TeamBucket.uri))
    return [Allowed(row.uri, row.read_only) for row in rows]


def replace(session: Session, team: Team, buckets: list[BucketIn]) -> list[Allowed]:
    """The team's list becomes `buckets` (in the caller's transaction)."""
    session.execute(delete(TeamBucket).where(TeamBucket.team_id == team.id))
    session.add_all(TeamBucket(team_id=team.id, uri=b.uri, read_only=b.read_only) for b in buckets)
    session.flush()
    return allowed(session, team.id)


def holding(allow: list[Allowed], uri: str) -> Allowed | None:
    """The narrowest listed prefix that holds `uri` (None: not listed)."""
    found = [a for a in allow if a.holds(uri)]
    return max(found, key=lambda a: len(a.uri)) if found else None
