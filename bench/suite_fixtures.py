"""What the test suite's database fixture costs per test, before and after
it copied a migrated SQLite file instead of migrating each time; and the
PostgreSQL half's per-test cost (emptying the run's one migrated database)
beside what migrating a fresh database or cloning a template would cost.

Wall time and this process's CPU time are printed for each (the machine is
shared: CPU time is the figure that load does not inflate). The load
average is printed with them.

    python bench/suite_fixtures.py [--rounds 20]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from spotbroker.broker.store import migrate
from spotbroker.broker.store.db import Base, make_engine

PG_ADMIN_URL = os.environ.get("SPOTBROKER_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


RESTART_SEQUENCES = """DO $$ DECLARE s record; BEGIN
  FOR s IN SELECT sequence_schema, sequence_name FROM information_schema.sequences LOOP
    EXECUTE format('ALTER SEQUENCE %I.%I RESTART', s.sequence_schema, s.sequence_name);
  END LOOP; END $$"""


def timed(what: str, rounds: int, step: Callable[[int], None]) -> None:
    walls, cpus = [], []
    for i in range(rounds):
        w, c = time.perf_counter(), time.process_time()
        step(i)
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    print(f"{what:<46} wall median {statistics.median(walls) * 1000:8.1f} ms   "
          f"cpu median {statistics.median(cpus) * 1000:8.1f} ms")


def sqlite(rounds: int, root: Path) -> None:
    def migrate_fresh(i: int) -> None:
        engine = make_engine(f"sqlite:///{root / f'm{i}.db'}")
        migrate.upgrade(engine)
        engine.dispose()

    template = root / "template.db"
    migrate_fresh(-1)
    shutil.move(root / "m-1.db", template)
    timed("sqlite: migrate a new file (before)", rounds, migrate_fresh)
    timed("sqlite: copy the migrated template (after)", rounds,
          lambda i: shutil.copyfile(template, root / f"c{i}.db"))


def admin(sql: str) -> None:
    engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(sql))
    engine.dispose()


def postgresql(rounds: int) -> None:
    base = f"suite_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    url = make_url(PG_ADMIN_URL)
    made: list[str] = []

    def create(name: str, template: str | None = None) -> str:
        admin(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        made.append(name)
        return url.set(database=name).render_as_string(hide_password=False)

    try:
        shared = make_engine(create(base))
        migrate.upgrade(shared)
        names = ", ".join(t.name for t in Base.metadata.sorted_tables)

        def truncate(_: int) -> None:
            with shared.begin() as conn:
                conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))

        def delete(_: int) -> None:
            with shared.begin() as conn:
                for table in reversed(Base.metadata.sorted_tables):
                    conn.execute(table.delete())
                conn.execute(text(RESTART_SEQUENCES))

        def migrate_new(i: int) -> None:
            engine = make_engine(create(f"{base}_m{i}"))
            migrate.upgrade(engine)
            engine.dispose()

        shared.dispose()
        timed("postgresql: clone a migrated template", rounds, lambda i: create(f"{base}_t{i}", base))
        shared = make_engine(url.set(database=base).render_as_string(hide_password=False))
        timed("postgresql: TRUNCATE the run's database (before)", rounds, truncate)
        timed("postgresql: DELETE from it, restart sequences (after)", rounds, delete)
        shared.dispose()
        timed("postgresql: create and migrate a new database", max(3, rounds // 4), migrate_new)
    finally:
        for name in made:
            admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", file=sys.stderr)
    root = Path(tempfile.mkdtemp(prefix="suite-bench-"))
    try:
        sqlite(args.rounds, root)
        postgresql(args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
