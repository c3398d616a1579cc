"""Schema migrations (Alembic), run from code: `spotbroker db upgrade`,
the server's start-up check, and the readiness probe."""
from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

from spotbroker.broker.store import sealing
from spotbroker.broker.store.sealing import Keyring


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("spotbroker.migrations")))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


@functools.cache
def head_revision() -> str | None:
    """The newest migration this code knows. Its scripts (each a module) are
    read once per process: the readiness probe asks every few seconds."""
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return _database_revision(conn)


def _database_revision(conn) -> str | None:
    """What `alembic_version` holds, read without a MigrationContext (whose set-up
    logs two INFO lines: on every readiness probe, a replica's log would be little else)."""
    if not inspect(conn).has_table("alembic_version"):
        return None
    heads = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    if len(heads) > 1:
        raise RuntimeError(f"the database has {len(heads)} migration heads: {sorted(heads)}")
    return heads[0] if heads else None


def is_current(engine: Engine) -> bool:
    return current_revision(engine) == head_revision()


# Every broker's migration on PostgreSQL holds this lock for its transaction:
# replicas started at once (each with SPOTBROKER_MIGRATE_ON_START) migrate one
# after the other, the later finding the schema current, instead of racing
# to create the same tables (one failed with a UniqueViolation).
MIGRATION_LOCK = 0x5B0B_0001


def upgrade(engine: Engine, revision: str = "head", keyring: Keyring | None = None) -> None:
    """`keyring`: what seals the secrets already stored (migration 0009);
    default, the one the settings give (see `migration_keyring`)."""
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        _one_at_a_time(conn)
        cfg.attributes["connection"], cfg.attributes["keyring"] = conn, keyring
        command.upgrade(cfg, revision)


def downgrade(engine: Engine, revision: str, keyring: Keyring | None = None) -> None:
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        _one_at_a_time(conn)
        cfg.attributes["connection"], cfg.attributes["keyring"] = conn, keyring
        command.downgrade(cfg, revision)


def _one_at_a_time(conn) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})


def migration_keyring(attributes: dict) -> Keyring:
    """The keyring a migration that seals or opens rows uses: the caller's,
    else the settings' (the alembic command line, `spotbroker db upgrade`).
    Asked for only when there are rows to seal, so an empty database needs no key."""
    from spotbroker.broker.settings import get_settings

    return attributes.get("keyring") or sealing.keyring(get_settings())


class SchemaBehind(RuntimeError):
    pass


def prepare(engine: Engine, data_dir: Path, keyring: Keyring | None = None) -> None:
    """Make the database ready for a broker: SQLite (the embedded default) is
    migrated here; PostgreSQL is shared by several brokers and is migrated on
    purpose, by `spotbroker db upgrade`, so one that is behind is refused."""
    if engine.dialect.name == "sqlite":
        data_dir.mkdir(parents=True, exist_ok=True)
        if not is_current(engine):  # (alembic reads every migration's module to find that there is nothing to do)
            upgrade(engine, keyring=keyring)
    elif not is_current(engine):
        have, want = current_revision(engine), head_revision()
        raise SchemaBehind(f"the database schema is at {have or 'nothing'} and this broker needs {want}: "
                           "run 'spotbroker db upgrade' first")
