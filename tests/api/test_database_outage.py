"""The database going away under a running broker: its connections dropped
(a PostgreSQL failover or restart), or no connection to be had for a while."""
from __future__ import annotations

from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from support.helpers import PG_ADMIN_URL


@contextmanager
def _admin():
    engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def _drop_connections(conn, name: str) -> None:
    conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = :name AND pid <> pg_backend_pid()"), {"name": name})


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_dropped_connections_are_replaced_unseen_and_an_outage_is_a_503(api, team_headers, db_url):
    headers = team_headers()
    assert api.get("/v1/jobs", headers=headers).status_code == 200  # the pool holds live connections
    name = make_url(db_url).database
    with _admin() as conn:
        _drop_connections(conn, name)
    # Each pooled connection is found dead before it is used (it was a 500 and a traceback).
    for _ in range(3):
        r = api.get("/v1/jobs", headers=headers)
        assert r.status_code == 200, r.text
    with _admin() as conn:
        conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
        try:
            _drop_connections(conn, name)
            r = api.get("/v1/jobs", headers=headers)
            assert r.status_code == 503 and r.headers["Retry-After"], r.text
            assert "database" in r.json()["detail"]
            # A body with a token this server has not seen yet: who sends it is asked of the
            # database before the body is read (api/guard.py), which answers 503 too, not a 500.
            r = api.post("/v1/jobs", json={"run": "true"}, headers={"Authorization": "Bearer sbt_not-seen-yet"})
            assert r.status_code == 503 and r.headers["Retry-After"], r.text
            assert "database" in r.json()["detail"]
        finally:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
    assert api.get("/v1/jobs", headers=headers).status_code == 200
