"""Uploaded workdirs: a team's code, stored by the broker under the team's
own storage prefix and named by its sha256.

    {checkpoint root}/{team}/uploads/{sha256}.tar.gz

The broker alone decides that path: a client sends the bytes and their
hash (`PUT /v1/uploads/{sha256}`), nothing else. A job refers to an upload
by hash (`workdir: {upload: SHA256}`); each attempt's node fetches it and
unpacks it as the attempt's working directory (`spotbroker.agent.code`).
The same archive uploaded twice is stored once. A team keeps at most
`upload_quota_bytes` of uploads: an upload checks the quota and reserves its
bytes in one database transaction before it is stored (`_reserved`), so
uploads racing on several brokers cannot together pass it.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from urllib.parse import unquote, urlparse

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from spotbroker.agent.checkpoint.storage import Storage
from spotbroker.agent.code import CodeError, check_archive
from spotbroker.broker.clock import SYSTEM_CLOCK, Clock
from spotbroker.broker.settings import Settings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import Team, UploadReservation

UPLOADS = "uploads"
# An upload's reservation stops counting after this (its broker died while storing it).
RESERVATION_SECONDS = 3600


@dataclass(frozen=True)
class CodeRef:
    """The job's uploaded workdir: an archive in the team's storage prefix,
    as a launch request hands it to each node (broker/launch/base.py)."""

    uri: str
    sha256: str


class UploadInvalid(ValueError):
    """The archive is not one a node would unpack: why."""


class QuotaExceeded(Exception):
    """Storing the archive would take the team over its upload quota: why."""


def _team_store(settings: Settings, team: str) -> Storage:
    return Storage(f"{settings.checkpoint_uri.rstrip('/')}/{team}")


def _key(sha256: str) -> str:
    return f"{UPLOADS}/{sha256}.tar.gz"


def code_ref(settings: Settings, team: str, sha256: str) -> CodeRef:
    """Where a job's uploaded workdir is, for the launcher."""
    return CodeRef(uri=_team_store(settings, team).url(_key(sha256)), sha256=sha256)


def size(settings: Settings, team: str, sha256: str) -> int | None:
    """The stored archive's bytes, or None when this team has no such upload."""
    info = _team_store(settings, team).head(_key(sha256))
    return None if info is None else info.size


def store(settings: Settings, factory: sessionmaker[Session], team_id: int, team: str, sha256: str,
          archive: Path, clock: Clock = SYSTEM_CLOCK) -> int:
    """Store an archive whose sha256 the caller has checked; returns its unpacked bytes.

    Refused (QuotaExceeded) when it would take the team over its upload
    quota, before anything else is done with it; then refused
    (UploadInvalid) when a node would refuse it, so a job never learns at
    launch that its code cannot be unpacked. The check reads the archive as
    a stream, bounding its files' bytes and number as it goes, and follows
    its links by name (`check_archive`): nothing is unpacked here."""
    team_store = _team_store(settings, team)
    with _reserved(settings, factory, team_id, team_store, sha256, archive.stat().st_size, clock):
        try:
            _, unpacked = check_archive(archive)
        except CodeError as exc:
            raise UploadInvalid(str(exc)) from None
        _keep_from_jobs(team_store.uri)
        team_store.put_file(_key(sha256), archive)
    return unpacked


def quota_usage(settings: Settings, factory: sessionmaker[Session], team_id: int, team: str,
                sha256: str) -> tuple[int, int, int] | None:
    """(quota, bytes stored, bytes of the team's other uploads in progress),
    or None when no quota applies (none set, or the team has these bytes
    already): asked before the body is read, so that a team over its quota
    costs the broker no disk, whether the client declares the body's length
    or streams it. `store` checks again, under the lock."""
    quota = settings.upload_quota_bytes
    team_store = _team_store(settings, team)
    if not quota or team_store.head(_key(sha256)) is not None:
        return None
    with factory() as session:
        held = session.scalar(select(func.coalesce(func.sum(UploadReservation.bytes), 0)).where(
            UploadReservation.team_id == team_id, UploadReservation.sha256 != sha256,
            UploadReservation.expires_at >= SYSTEM_CLOCK.now()))
    return quota, sum(o.size for o in team_store.iter(UPLOADS)), held


def over_quota(usage: tuple[int, int, int] | None, incoming: int) -> str | None:
    """Why `incoming` more bytes would take the team over its quota (`quota_usage`), or None."""
    return None if usage is None else _over(*usage, incoming)


def _over(quota: int, stored: int, held: int, incoming: int) -> str | None:
    if stored + held + incoming <= quota:
        return None
    in_flight = f" and {held} bytes of uploads in progress" if held else ""
    return (f"your team's uploads would take {stored + held + incoming} bytes, over its quota of {quota} bytes "
            f"(SPOTBROKER_UPLOAD_QUOTA_BYTES); {stored} bytes are stored already{in_flight}")


def used(settings: Settings, team: str) -> int:
    """Bytes of the team's stored uploads."""
    return sum(o.size for o in _team_store(settings, team).iter(UPLOADS))


@contextmanager
def _reserved(settings: Settings, factory: sessionmaker[Session], team_id: int, team_store: Storage, sha256: str,
              incoming: int, clock: Clock) -> Iterator[None]:
    """Hold `incoming` bytes of the team's quota while the archive is stored,
    or refuse it (QuotaExceeded) when the team's stored uploads, plus what its
    other uploads in flight hold, plus it would exceed `upload_quota_bytes`
    (one the team already has costs nothing). The check and the reservation
    are one transaction under the team's lock, so two uploads racing, on any
    brokers sharing the database, cannot both pass."""
    quota = settings.upload_quota_bytes
    if not quota or team_store.head(_key(sha256)) is not None:
        yield
        return
    now = clock.now()
    with transaction(factory) as session:
        # SQLite's writers are serialised already (BEGIN IMMEDIATE); on
        # PostgreSQL the team's row is the lock (NO KEY: rows that refer to
        # the team can still be written meanwhile).
        session.execute(select(Team.id).where(Team.id == team_id).with_for_update(key_share=True))
        session.execute(delete(UploadReservation).where(UploadReservation.expires_at < now))
        held = session.scalar(select(func.coalesce(func.sum(UploadReservation.bytes), 0)).where(
            UploadReservation.team_id == team_id, UploadReservation.sha256 != sha256))
        if problem := _over(quota, sum(o.size for o in team_store.iter(UPLOADS)), held, incoming):
            raise QuotaExceeded(problem)
        session.merge(UploadReservation(team_id=team_id, sha256=sha256, bytes=incoming,
                                        expires_at=now + timedelta(seconds=RESERVATION_SECONDS)))
    try:
        yield
    finally:
        with transaction(factory) as session:
            session.execute(delete(UploadReservation).where(UploadReservation.team_id == team_id,
                                                            UploadReservation.sha256 == sha256))


def _keep_from_jobs(team_uri: str) -> None:
    """On a local disk, the uploads are the broker's alone: the node fetches
    them as the broker's user, and local jobs (all one user) cannot read
    another team's stored uploads (a running job's unpacked copy is another
    matter: see the README on what the local launcher does not isolate).
    The team's directory is entered, not listed, as the node makes it.
    Both are made so before an archive is written there."""
    parsed = urlparse(team_uri)
    if parsed.scheme == "file":
        team_dir = Path(unquote(parsed.path))
        (team_dir / UPLOADS).mkdir(parents=True, exist_ok=True)
        os.chmod(team_dir, 0o711)
        os.chmod(team_dir / UPLOADS, 0o700)


def workdir_error(settings: Settings, team: str, workdir: object) -> dict[str, str] | None:
    """Why a submitted spec's `workdir` cannot be used, as a field error, or None."""
    if workdir is None:
        return None
    if isinstance(workdir, str):
        return {"field": "workdir", "message": (
            f"{workdir!r} would be a path on the broker's host, which jobs may not use: upload the directory "
            "(`spotbroker submit FILE` does it for you; over REST, PUT /v1/uploads/{sha256}) and give "
            "workdir: {upload: SHA256}")}
    sha256 = workdir.upload  # type: ignore[attr-defined]
    if size(settings, team, sha256) is None:
        return {"field": "workdir.upload", "message": f"your team has no upload {sha256} (PUT /v1/uploads/{sha256})"}
    return None


def receiving_dir(settings: Settings) -> Path:
    """Where this broker process writes uploads as they arrive: a directory
    of its own under the data directory (brokers on one host may share it),
    named by its pid and start time. Those of processes gone (a broker
    killed mid-upload left its file in /tmp for good) are removed when the
    next one makes its own."""
    import shutil

    from spotbroker.agent.proctree import start_time

    root = settings.data_dir / "receiving"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    for old in root.iterdir():
        pid, _, started = old.name.partition("-")
        if not (pid.isdigit() and start_time(int(pid)) == started):
            shutil.rmtree(old, ignore_errors=True)
    mine = root / f"{os.getpid()}-{start_time(os.getpid())}"
    mine.mkdir(exist_ok=True, mode=0o700)
    return mine
