"""Migrations: upgrade, then `alembic check` finds nothing, then downgrade,
on both databases (each on a database of its own)."""
import pytest
from alembic import command
from sqlalchemy import inspect
from support.helpers import create_pg_database, drop_pg_database

from spotbroker.broker.store import migrate
from spotbroker.broker.store.db import make_engine


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


def test_brokers_migrating_at_once_take_turns(pg_server):
    """Replicas started together on PostgreSQL (SQLite is one broker's),
    each migrating at its start: one failed with a UniqueViolation (both
    created the same tables)."""
    import threading

    url = create_pg_database("spotbroker_migrate")
    engines = [make_engine(url) for _ in range(3)]
    failures: list[BaseException] = []

    def migrate_one(engine) -> None:
        try:
            migrate.upgrade(engine)
        except BaseException as exc:  # noqa: BLE001 (what failed is the assertion's message)
            failures.append(exc)

    threads = [threading.Thread(target=migrate_one, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    try:
        assert not failures, failures
        assert all(migrate.is_current(e) for e in engines)
    finally:
        for e in engines:
            e.dispose()
        drop_pg_database(url)


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


def test_upgrade_fills_each_attempts_end_reason_from_its_words(empty_url):
    """0003 -> head: why each attempt ended (or, in a PREEMPTING job, is
    ending) is read from the reason text of the rows written before."""
    from sqlalchemy import text

    engine = make_engine(empty_url)
    migrate.upgrade(engine, "0003")
    rows = [  # (attempt id, job id, attempt state, attempt reason, expected end_reason)
        (1, 1, "PREEMPTED", "preempted", "preempted"), (2, 1, "PREEMPTED", "vanished", "vanished"),
        (3, 1, "PREEMPTED", "moved", "moved"), (4, 1, "FAILED", "no_capacity", "no_capacity"),
        (5, 1, "FAILED", "launch_error", "launch_error"), (6, 1, "FAILED", "exit 3", "failed"),
        (7, 1, "SUCCEEDED", "exit 0", "succeeded"), (8, 1, "CANCELLED", "cancelled", "cancelled"),
        (9, 1, "RUNNING", None, None), (10, 2, "RUNNING", None, "moved"), (11, 3, "RUNNING", None, "preempted"),
    ]
    jobs = [(1, "RUNNING", None), (2, "PREEMPTING", "moving: deadline"), (3, "PREEMPTING", "preemption notice")]
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO teams (id, name, created_at) VALUES (1, 'ml', CURRENT_TIMESTAMP)"))
        for job_id, state, reason in jobs:
            conn.execute(text("INSERT INTO jobs (id, team_id, name, state, reason, spec, restarts, recoveries, "
                              "created_at, updated_at, version) VALUES (:id, 1, 'j', :state, :reason, '{}', 0, 0, "
                              "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 1)"), {"id": job_id, "state": state,
                                                                            "reason": reason})
        for attempt_id, job_id, state, reason, _ in rows:
            conn.execute(text("INSERT INTO attempts (id, job_id, state, reason, launcher, cloud, accelerator_count, "
                              "use_spot, num_nodes, price_per_hour, released, agent_seq, created_at, updated_at, "
                              "version) VALUES (:id, :job, :state, :reason, 'local', 'aws', 1, true, 1, 0.5, false, "
                              "0, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 1)"),
                         {"id": attempt_id, "job": job_id, "state": state, "reason": reason})
    migrate.upgrade(engine)
    with engine.connect() as conn:
        got = dict(conn.execute(text("SELECT id, end_reason FROM attempts")).all())
    assert got == {attempt_id: want for attempt_id, *_, want in rows}
    migrate.downgrade(engine, "0003")
    engine.dispose()


def test_0011_seals_the_secrets_written_in_clear_and_a_downgrade_opens_them(empty_url):
    """0010 -> head on a database holding a job's secrets and a budget's
    notification targets in clear: sealed with the given keyring, readable
    as before; and back."""
    import json

    from sqlalchemy import text

    from spotbroker.broker.jobs import sealed
    from spotbroker.broker.money import budgets
    from spotbroker.broker.store.sealing import Keyring

    spec = {"name": "j", "run": "true", "secrets": {"HF_TOKEN": "hf-clear-1", "WANDB": "wb-clear-2"}}
    targets = [{"name": "ops", "kind": "webhook", "url": "https://hooks.example.com/T/B/clear-3", "to": []},
               {"name": "mail", "kind": "email", "smtp_url": "smtps://u:clear-4@smtp.example.com",
                "to": ["ops@example.com"], "from": "b@example.com"}]
    keyring = Keyring.from_material([b"the migration test's key"])
    load = lambda v: json.loads(v) if isinstance(v, str) else v  # noqa: E731  (PostgreSQL's JSON comes parsed)
    engine = make_engine(empty_url)
    migrate.upgrade(engine, "0010")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO teams (id, name, created_at) VALUES (7, 'ml', CURRENT_TIMESTAMP)"))
        for job_id, job_spec in ((1, spec), (2, {"name": "k", "run": "true"})):
            conn.execute(text("INSERT INTO jobs (id, team_id, name, state, spec, restarts, recoveries, created_at, "
                              "updated_at, version) VALUES (:id, 7, 'j', 'PENDING', :spec, 0, 0, CURRENT_TIMESTAMP, "
                              "CURRENT_TIMESTAMP, 1)"), {"id": job_id, "spec": json.dumps(job_spec)})
        conn.execute(text("INSERT INTO budgets (team_id, amount, period, hard_cap_action, recoveries, rules, targets, "
                          "created_at, updated_at) VALUES (7, 5, 'month', 'hold_new', 'allow', '{}', :t, "
                          "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"), {"t": json.dumps(targets)})

    def raw() -> str:
        with engine.connect() as conn:
            return " ".join(str(r) for q in ("SELECT spec FROM jobs ORDER BY id", "SELECT targets FROM budgets")
                            for r in conn.execute(text(q)).scalars())

    migrate.upgrade(engine, keyring=keyring)
    assert not any(f"clear-{i}" in raw() for i in range(1, 5)), raw()
    with engine.connect() as conn:
        stored = load(conn.execute(text("SELECT spec FROM jobs WHERE id = 1")).scalar())
        other = load(conn.execute(text("SELECT spec FROM jobs WHERE id = 2")).scalar())
        (row,) = conn.execute(text("SELECT team_id, targets FROM budgets")).all()
    assert sealed.values(stored, 7, keyring) == spec["secrets"] and other == {"name": "k", "run": "true"}
    saved = [budgets.StoredTarget(7, t["name"], t["kind"], t["sealed"]) for t in load(row.targets)]
    assert [t.open(keyring).model_dump(by_alias=True, exclude_none=True) for t in saved] == targets

    migrate.downgrade(engine, "0010", keyring=keyring)
    with engine.connect() as conn:
        assert load(conn.execute(text("SELECT spec FROM jobs WHERE id = 1")).scalar()) == spec
        assert load(conn.execute(text("SELECT targets FROM budgets")).scalar()) == targets
    engine.dispose()


def test_0018_copies_the_labels_of_jobs_stored_before(empty_url):
    """A job's labels, kept until now in its spec only, become job_labels rows
    (with alternatives: those every one carries); a downgrade drops the table."""
    import json

    from sqlalchemy import text

    engine = make_engine(empty_url)
    migrate.upgrade(engine, "0017")
    specs = {1: {"run": "x", "resources": {"labels": {"project": "llama", "owner": "ann"}}},
             2: {"run": "x", "resources": {"any_of": [{"labels": {"project": "vit", "pool": "a"}},
                                                      {"labels": {"project": "vit"}}]}},
             3: {"run": "x"}}
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO teams (id, name, created_at) VALUES (1, 'ml', CURRENT_TIMESTAMP)"))
        for job_id, spec in specs.items():
            conn.execute(text("INSERT INTO jobs (id, team_id, name, state, spec, restarts, recoveries, created_at, "
                              "updated_at, version) VALUES (:id, 1, 'j', 'SUCCEEDED', :spec, 0, 0, "
                              "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 1)"), {"id": job_id, "spec": json.dumps(spec)})
    migrate.upgrade(engine)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT job_id, team_id, key, value FROM job_labels ORDER BY job_id, key")).all()
    assert [tuple(r) for r in rows] == [(1, 1, "owner", "ann"), (1, 1, "project", "llama"), (2, 1, "project", "vit")]
    migrate.downgrade(engine, "0017")
    assert "job_labels" not in inspect(engine).get_table_names()
    engine.dispose()
