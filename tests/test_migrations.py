"""Migrations: upgrade, then `alembic check` finds nothing, then downgrade,
on both databases (each on a database of its own)."""
import pytest
from alembic import command
from sqlalchemy import inspect

from helpers import create_pg_database, drop_pg_database
from spotbroker.broker import migrate
from spotbroker.broker.db import make_engine


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'm.db'}"
        return
    request.getfixturevalue("pg_server")
    url = create_pg_database("spotbroker_migrate")
    yield url
    drop_pg_database(url)


def test_upgrade_check_downgrade(empty_url):
    engine = make_engine(empty_url)
    assert not migrate.is_current(engine)
    migrate.upgrade(engine)
    assert migrate.is_current(engine)
    assert {"teams", "api_tokens", "offers", "jobs", "attempts", "events"} <= set(inspect(engine).get_table_names())
    cfg = migrate.alembic_config(empty_url)
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.check(cfg)  # raises if the models and the migrations disagree
    migrate.downgrade(engine, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    engine.dispose()
