"""Schema migrations (Alembic), run from code: `spotbroker db upgrade`,
the server's start-up check, and the readiness probe."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("spotbroker.migrations")))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision(url: str) -> str | None:
    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def is_current(engine: Engine) -> bool:
    return current_revision(engine) == head_revision(str(engine.url))


def upgrade(engine: Engine, revision: str = "head") -> None:
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(engine: Engine, revision: str) -> None:
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


class SchemaBehind(RuntimeError):
    pass


def prepare(engine: Engine, data_dir: Path) -> None:
    """Make the database ready for a broker: SQLite (the embedded default) is
    migrated here; PostgreSQL is shared by several brokers and is migrated on
    purpose, by `spotbroker db upgrade`, so one that is behind is refused."""
    if engine.dialect.name == "sqlite":
        data_dir.mkdir(parents=True, exist_ok=True)
        upgrade(engine)
    elif not is_current(engine):
        have, want = current_revision(engine), head_revision(str(engine.url))
        raise SchemaBehind(f"the database schema is at {have or 'nothing'} and this broker needs {want}: "
                           "run 'spotbroker db upgrade' first")
