"""Migrations: upgrade, then `alembic check` finds nothing, then downgrade,
on both databases (each on a database of its own)."""
import pytest
from alembic import command
from helpers import create_pg_database, drop_pg_database
from sqlalchemy import inspect

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
    assert {"teams", "api_tokens", "offers", "price_offers", "price_source_leases", "jobs", "attempts",
            "events"} <= set(inspect(engine).get_table_names())
    cfg = migrate.alembic_config(empty_url)
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.check(cfg)  # raises if the models and the migrations disagree
    migrate.downgrade(engine, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    engine.dispose()


def test_upgrade_keeps_rows_written_by_the_first_schema(empty_url):
    """0001 -> head on a database with a team, a job and an attempt in it."""
    from sqlalchemy import text

    engine = make_engine(empty_url)
    migrate.upgrade(engine, "0001")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO teams (id, name, created_at) VALUES (1, 'ml', CURRENT_TIMESTAMP)"))
        conn.execute(text("INSERT INTO jobs (id, team_id, name, state, spec, restarts, recoveries, created_at, "
                          "updated_at, version) VALUES (1, 1, 'j', 'RUNNING', '{}', 0, 0, CURRENT_TIMESTAMP, "
                          "CURRENT_TIMESTAMP, 1)"))
        conn.execute(text("INSERT INTO attempts (id, job_id, state, launcher, cloud, accelerator_count, use_spot, "
                          "num_nodes, price_per_hour, released, created_at, updated_at, version) VALUES "
                          "(1, 1, 'RUNNING', 'local', 'local', 0, false, 1, 0, false, CURRENT_TIMESTAMP, "
                          "CURRENT_TIMESTAMP, 1)"))
    migrate.upgrade(engine)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT agent_seq FROM attempts WHERE id = 1")).scalar() == 0
    migrate.downgrade(engine, "0001")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM attempts")).scalar() == 1
    engine.dispose()
