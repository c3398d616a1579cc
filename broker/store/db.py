"""Engine, sessions and the declarative base shared by every model."""
from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import DateTime, MetaData, TypeDecorator, create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.orm.exc import StaleDataError

# Named constraints make migrations reproducible on both databases.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always UTC-aware in Python, whatever the database.

    SQLite has no time zones, so values are stored naive in UTC and made
    aware again on the way out; a naive value on the way in is an error.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime()}


def make_engine(url: str, **kwargs: Any) -> Engine:
    if url.startswith("sqlite"):
        private_sqlite_files(url)
        # A connection here is a file handle: as many as the server's threads
        # (40) and its background duties, so that no request waits 30 s for
        # one behind other requests' costly reads (QueuePool's default is 15).
        kwargs.setdefault("pool_size", 10)
        kwargs.setdefault("max_overflow", 50)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False}, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 20)
    # A connection is pinged as it is taken from the pool: after a failover or a
    # restart of the server every pooled connection is dead, and each one was
    # a request's 500 (or a reconciler step's failure) before it was replaced.
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_recycle", 1800)
    return create_engine(url, **kwargs)


SQLITE_COMPANIONS = ("", "-wal", "-shm", "-journal")


def private_sqlite_files(url: str) -> None:
    """The database file, made (or made again) readable by the broker's user
    only, wherever the URL puts it: it holds every team's specs, token
    digests and events. SQLite gives its WAL and shared-memory files the
    database file's mode, so they follow; ones left by an earlier broker
    are closed too. A file another user owns is that user's to protect."""
    path = make_url(url).database
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    except OSError:
        return  # no such directory, or not ours: SQLite says so when it opens it
    for suffix in SQLITE_COMPANIONS:
        try:
            info = os.stat(path + suffix)
            if info.st_uid == os.geteuid() and info.st_mode & 0o077:
                os.chmod(path + suffix, info.st_mode & 0o700)
        except FileNotFoundError:
            pass


def _sqlite_begin(conn: Any) -> None:
    # pysqlite's own transaction handling is off (see _sqlite_pragmas), so we
    # emit BEGIN. A unit of work that writes takes the write lock up front
    # (IMMEDIATE): a deferred transaction that reads, then writes, fails at
    # once when another process wrote in between. Reads stay deferred, and
    # WAL lets them run beside a writer.
    immediate = conn.get_execution_options().get(IMMEDIATE, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # we emit BEGIN (see make_engine)
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    # Deleted rows' pages are reused, not zeroed first (the build's default): zeroing
    # 1 GiB of an old attempt's log took 11.5 s inside a launch (the file is ours alone).
    cur.execute("PRAGMA secure_delete=FAST")
    cur.close()


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


IMMEDIATE = "spotbroker_immediate"


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work that writes: commit on success, roll back on any error."""
    with factory() as session, session.begin():
        session.connection(execution_options={IMMEDIATE: True})
        yield session


T = TypeVar("T")
CONFLICT_TRIES = 3


def retrying(factory: sessionmaker[Session], work: Callable[[Session], T], tries: int = CONFLICT_TRIES) -> T:
    """`work` in a transaction, taken again from a fresh read when another
    writer (the reconciler, an agent's report, another broker) changed a
    versioned row it writes meanwhile, or when PostgreSQL ended it to break
    a deadlock with one; the error after the last try."""
    for tries_left in range(tries - 1, -1, -1):
        try:
            with transaction(factory) as session:
                return work(session)
        except StaleDataError:
            if not tries_left:
                raise
        except OperationalError as exc:
            if not tries_left or getattr(exc.orig, "sqlstate", None) != DEADLOCK:
                raise
            # The winner waits to be woken for the row the victim held; a victim that
            # tries again at once can take that row first and deadlock with it again.
            time.sleep(random.uniform(0.02, 0.1))
    raise AssertionError("unreachable")


def driver_said(exc: Exception) -> str:
    """What the database driver said, its first line (the rest is SQLAlchemy's
    statement and a link): for a log line or an error message. (An error of
    SQLAlchemy's own, with no driver's behind it, says its own first line.)"""
    said = getattr(exc, "orig", None) or exc
    lines = str(said).strip().splitlines()
    return lines[0] if lines else type(said).__name__


DEADLOCK = "40P01"  # PostgreSQL's deadlock_detected: the victim's transaction is rolled back, to be tried again
