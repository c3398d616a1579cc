"""What the broker writes on its host is private to its user, wherever the
operator puts it: the database (and its WAL and shared memory) outside the
data directory, and the records of each run. A job of another team (its own
uid, or root's in a container) read them at 0644."""
from __future__ import annotations

import os
import sqlite3
import stat
from contextlib import contextmanager

from conftest import ADMIN_TOKEN, served
from support.helpers import stop_local_nodes, wait_state

from spotbroker.broker.settings import Settings
from spotbroker.broker.store.db import make_engine


@contextmanager
def _umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_database_outside_the_data_directory_and_every_run_record_are_the_brokers_alone(tmp_path, data_dir):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    db = elsewhere / "b.db"
    settings = Settings(database_url=f"sqlite:///{db}", data_dir=data_dir, admin_token=ADMIN_TOKEN,
                        reconcile_interval=0.05, local_kill_grace_seconds=2, local_max_running=8,
                        secret_key="test-signing-key", _env_file=None)
    with _umask(0o022):  # the usual umask, under which a file is made 0644
        try:
            with served(settings) as api:
                r = api.post("/v1/teams", json={"name": "ml"}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
                h = {"Authorization": f"Bearer {r.json()['token']}"}
                job = api.post("/v1/jobs", json={"run": "true"}, headers=h).json()
                done = wait_state(api, h, job["id"], {"SUCCEEDED"}, timeout=60)
                modes = {p.name: _mode(p) for p in elsewhere.iterdir()}
                assert {"b.db", "b.db-wal", "b.db-shm"} <= set(modes), modes
                assert set(modes.values()) == {0o600}, modes
                run_dir = data_dir / "runs" / str(done["attempts"][-1]["id"])
                records = {p.name: _mode(p) for p in run_dir.iterdir() if p.is_file()}
                assert {"node-0.json", "node-0.self", "exit-0"} <= set(records), records
                assert {name: mode for name, mode in records.items() if mode & 0o077} == {}
        finally:
            stop_local_nodes(data_dir)


def test_a_database_an_earlier_broker_left_readable_is_closed_with_its_wal(tmp_path):
    db = tmp_path / "old.db"
    with _umask(0o022):
        conn = sqlite3.connect(db)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (x)")
        conn.execute("INSERT INTO t VALUES (1)")
        conn.commit()
        assert _mode(db) == 0o644 and _mode(f"{db}-wal") == 0o644
        engine = make_engine(f"sqlite:///{db}")
        conn.close()
    try:
        assert _mode(db) == 0o600
        with engine.connect() as c:
            c.exec_driver_sql("SELECT * FROM t").all()
        assert {p.name: _mode(p) for p in tmp_path.iterdir()} == {
            name: 0o600 for name in ("old.db", "old.db-wal", "old.db-shm")}
    finally:
        engine.dispose()
