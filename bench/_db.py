"""A throw-away database for a benchmark: a SQLite file in a directory, or a
new PostgreSQL database (dropped afterwards) on SPOTBROKER_BENCH_PG_URL."""
from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

PG_ADMIN = os.environ.get("SPOTBROKER_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def temporary_database(kind: str, data_dir: Path) -> tuple[str, Callable[[], None]]:
    """(url, drop) for a fresh database of `kind` ("sqlite" or "postgresql")."""
    if kind == "sqlite":
        return f"sqlite:///{data_dir / 'broker.db'}", lambda: None
    name = f"spotbroker_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return make_url(PG_ADMIN).set(database=name).render_as_string(hide_password=False), drop
