"""Fixtures shared by the whole suite.

Every database test runs twice: on SQLite and on PostgreSQL. The PostgreSQL
server is the machine's (127.0.0.1:5432, user postgres) unless
SPOTBROKER_TEST_PG_URL names another; each test process (each xdist
worker) creates its own database, migrated once, empties it before every
test and drops it at the end. SQLite tests get a copy of one migrated file. Without a server the PostgreSQL half skips
with a message saying what is missing, except under CI=true, where it fails.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url
from support.brokerproc import TEST_DEFAULTS
from support.helpers import PG_ADMIN_URL, create_pg_database, drop_pg_database, stop_local_nodes

from spotbroker.broker.pricing.offers import seed_from_catalog
from spotbroker.broker.store import migrate
from spotbroker.broker.store.db import make_engine, make_session_factory, transaction

pytest_plugins = ["support.cpu_report"]  # SPOTBROKER_TEST_CPU=FILE: each test's CPU seconds


def _share_httpx_tls_context() -> None:
    """httpx parses the CA bundle for every client it makes (about 20 ms of
    CPU), and `httpx.get` makes a client per call: the suite's clients and
    polling loops did so thousands of times, to talk plain HTTP to this
    machine. Clients asking for the default verification share one context."""
    import functools

    from httpx._transports import default as transports

    build = transports.create_ssl_context
    shared = functools.cache(lambda trust_env: build(trust_env=trust_env))

    def create_ssl_context(verify=True, cert=None, trust_env=True):
        if verify is True and cert is None:
            return shared(trust_env)
        return build(verify=verify, cert=cert, trust_env=trust_env)

    transports.create_ssl_context = create_ssl_context


_share_httpx_tls_context()

ADMIN_TOKEN = "admin-token-for-tests"
# The suite's brokers (in this process, or started with this environment) read
# the price snapshot only, so that no test reaches the network (price tests name
# their fakes), and import SkyPilot only when a task file needs it (see
# support/brokerproc.py; tests/api/test_preload.py checks the preload).
for name, value in TEST_DEFAULTS.items():
    os.environ.setdefault(name, value)


# Every process the suite starts carries this mark in its environment (the
# jobs' own processes excepted: their environment is the launcher's
# allow-list, and their node ends them): what still carries it once the
# session is over was left behind. (Not a SPOTBROKER_ name: those are the
# broker's settings, which its local nodes do not inherit.)
SESSION_MARK = "PYTEST_SPOTBROKER_SESSION"
LEFTOVER_GRACE = 15.0


def pytest_configure(config: pytest.Config) -> None:
    # The suite runs on xdist workers (pyproject's addopts). A test that runs
    # pytest itself (tests/test_pg_required.py) wants one process, not two
    # more workers: it passes its environment on, and workers read their
    # options from the controller, not from PYTEST_ADDOPTS.
    os.environ["PYTEST_ADDOPTS"] = f"{os.environ.get('PYTEST_ADDOPTS', '')} -n 0".strip()
    if not hasattr(config, "workerinput"):  # the controller: its workers inherit the mark
        import uuid

        os.environ[SESSION_MARK] = uuid.uuid4().hex


@pytest.hookimpl(trylast=True)  # after xdist has ended its workers
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The suite leaves no process behind: what is still running with this
    session's mark after a grace is killed, named, and fails the run."""
    if hasattr(session.config, "workerinput"):
        return
    import time

    from spotbroker.agent.proctree import kill_tree, start_time

    mark = f"{SESSION_MARK}={os.environ[SESSION_MARK]}".encode()
    workers = session.config.pluginmanager.has_plugin("dsession")  # our children are xdist's workers
    deadline = time.monotonic() + LEFTOVER_GRACE
    while (left := _marked_processes(mark, spare_children=workers)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_sep("=", "processes left behind by the suite (killed)", red=True)
    for pid, (start, argv) in left.items():
        if start_time(pid) == start:
            kill_tree(pid)
        if reporter is not None:
            reporter.write_line(f"pid {pid}: {argv[:300]}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _marked_processes(mark: bytes, spare_children: bool) -> dict[int, tuple[str, str]]:
    from support.helpers import processes

    from spotbroker.agent.proctree import parent_of, start_time

    found = {}
    for pid, environ in processes("environ"):
        if pid == os.getpid() or mark not in environ:
            continue
        if spare_children and parent_of(pid) == os.getpid():  # an xdist worker still ending
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        if start := start_time(pid):
            found[pid] = (start, argv.strip())
    return found


def _file_seconds() -> dict[str, float]:
    """tests/durations.txt: seconds per test file (or per test of a file in
    SPREAD), from a measured run."""
    table = {}
    for line in Path(__file__).with_name("durations.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            seconds, name = line.split()
            table[name] = float(seconds)
    return table


# Files whose tests share nothing costly (no module fixture but a reference
# run, see helpers.once_per_run): xdist hands out each of their tests on its
# own, so that a heavy file spreads over the workers instead of holding one
# for minutes (the killed-brokers file was 295 s on one worker). Every other
# file goes whole to one worker (loadfile), so that its module fixtures (a
# moto server, SkyPilot's API server, a launched cluster) start once.
SPREAD = frozenset({
    "e2e/test_brokers_killed.py", "e2e/test_job_shapes.py", "e2e/test_distributed.py", "e2e/test_preemption.py",
    "e2e/test_job_isolation.py", "e2e/test_scoped_credentials.py", "api/test_jobs_api.py",
})


# The files that use SkyPilot's API server (support/skyenv.py's sky_aws): one
# unit, so that one worker runs them all and starts the server once (a start
# is about 30 s of CPU, the server's executors each importing SkyPilot).
SKY_SERVER_FILES = frozenset({"skypilot/test_launch_moto.py", "skypilot/test_node_program.py",
                              "skypilot/test_stack.py"})


def _unit(nodeid: str) -> str:
    """What one xdist worker takes at once: the test's file, or in a SPREAD file the test."""
    name = nodeid.removeprefix("tests/")
    file = name.split("::")[0]
    return name if file in SPREAD else file


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """loadfile, but for the SPREAD files' tests, each a unit of its own.
    (xdist's `xdist_group` marks would say the same, but xdist 3.8 records a
    group in `item._nodeid`, which pytest 9 no longer reads.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SpreadScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            unit = _unit(nodeid)
            if unit in SKY_SERVER_FILES:  # one unit: one worker starts SkyPilot's API server once for them
                return "the files sharing a SkyPilot API server"
            return nodeid if "::" in unit else super()._split_scope(nodeid)

    return SpreadScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # xdist hands out the units (above) to the workers in collection order
    # (with --no-loadscope-reorder): the slowest first, so that the run does
    # not end on one worker still in a long one while the others have
    # nothing left. A stable sort: tests keep their order within a file,
    # unlisted files theirs after the listed ones. The same order in every
    # worker. A test of a SPREAD file without its own line in the table
    # counts as its file's share.
    seconds = _file_seconds()
    units = [_unit(item.nodeid) for item in items]
    per_file: dict[str, int] = {}
    for unit in units:
        file = unit.split("::")[0]
        per_file[file] = per_file.get(file, 0) + 1

    def cost(unit: str) -> float:
        file = unit.split("::")[0]
        return seconds.get(unit, seconds.get(file, 0.0) / (per_file[file] if unit != file else 1))

    order = {id(item): -cost(unit) for item, unit in zip(items, units, strict=True)}
    items.sort(key=lambda item: order[id(item)])


def _pg_unavailable(reason: str) -> None:
    message = (f"PostgreSQL is not reachable at {make_url(PG_ADMIN_URL).render_as_string()} ({reason}); "
               "start it (scripts/ensure-postgres) or point SPOTBROKER_TEST_PG_URL at a server")
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def pg_server() -> str:
    try:
        probe = create_engine(PG_ADMIN_URL, connect_args={"connect_timeout": 3})
        with probe.connect() as conn:
            conn.execute(text("SELECT 1"))
        probe.dispose()
    except Exception as exc:  # any failure to connect means "no server here"
        _pg_unavailable(type(exc).__name__)
    return PG_ADMIN_URL


@pytest.fixture(scope="session")
def pg_database(pg_server: str) -> Iterator[str]:
    """One migrated database for the run; each test empties it before use.
    The bundled snapshot's offers are kept aside in it, in a schema of their
    own (`_SEED_SCHEMA`), for the tests whose broker would load them."""
    url = create_pg_database()
    engine = make_engine(url)
    migrate.upgrade(engine)
    with transaction(make_session_factory(engine)) as session:
        seed_from_catalog(session)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {_SEED_SCHEMA}"))
        for table in _SEEDED:
            conn.execute(text(f"CREATE TABLE {_SEED_SCHEMA}.{table} AS SELECT * FROM public.{table}"))
    _empty_all(engine)
    engine.dispose()
    yield url
    drop_pg_database(url)


# Every sequence back to its start, as in a freshly migrated database.
_RESTART_SEQUENCES = """DO $$ DECLARE s record; BEGIN
  FOR s IN SELECT sequence_schema, sequence_name FROM information_schema.sequences LOOP
    EXECUTE format('ALTER SEQUENCE %I.%I RESTART', s.sequence_schema, s.sequence_name);
  END LOOP; END $$"""


def _empty_all(engine: Engine, then: tuple[str, ...] = ()) -> None:
    """Every table emptied, children first, and `then` run after, in one
    round trip to the server (a statement each took 3-5 times as long under
    load, docs/benchmarks.md). DELETE, not TRUNCATE: a test leaves a few
    rows, and TRUNCATE gives every table and index a new file (about twice
    the time here)."""
    from spotbroker.broker.store.db import Base

    statements = [f'DELETE FROM "{table.name}"' for table in reversed(Base.metadata.sorted_tables)]
    with engine.begin() as conn:
        # The driver's own cursor: one batch of statements, no parameters.
        conn.connection.cursor().execute(";\n".join([*statements, _RESTART_SEQUENCES, *then]))


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SQLite file migrated for the run; each test gets a copy of it
    (a migration costs about half a second, a copy a millisecond)."""
    path = tmp_path_factory.mktemp("sqlite-template") / "broker.db"
    engine = make_engine(f"sqlite:///{path}")
    migrate.upgrade(engine)
    engine.dispose()
    # The last connection's close folds the write-ahead log into the file:
    # a copy of the file alone is then the whole database.
    assert not path.with_name(path.name + "-wal").exists(), "the template's WAL was not checkpointed"
    return path


@pytest.fixture(scope="session")
def sqlite_seeded_template(sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The migrated template with the bundled snapshot's offers loaded, as
    a broker's first start loads them (for the tests in `SERVED`)."""
    import shutil

    path = tmp_path_factory.mktemp("sqlite-seeded") / "broker.db"
    shutil.copyfile(sqlite_template, path)
    engine = make_engine(f"sqlite:///{path}")
    with transaction(make_session_factory(engine)) as session:
        seed_from_catalog(session)
    engine.dispose()
    assert not path.with_name(path.name + "-wal").exists(), "the seeded template's WAL was not checkpointed"
    return path


# A broker's start loads the bundled price snapshot into a database that has
# none (seed_from_catalog: 2,411 offers and their first samples, about 1.1 s
# of a test server's 1.4 s start under load, docs/benchmarks.md). A test
# whose server starts with these fixtures, before the test's own code runs,
# gets a database with the snapshot already loaded, stamped with the time
# of the test's start as that load would have stamped it; the server then
# finds it there and loads nothing. A test that would load it itself asks
# for `catalog_offers`. (Servers that a test starts itself, on a clock of
# its own or after writing its own offers, load it as before.)
SERVED = frozenset({"api", "agent_endpoint", "catalog_offers"})


@pytest.fixture
def catalog_offers() -> None:
    """The test's database holds the bundled snapshot's offers, loaded as at
    the test's start (what `seed_from_catalog` would write then; see SERVED)."""


_SEEDED = ("price_offers", "offers")   # what seed_from_catalog writes
_SEED_SCHEMA = "spotbroker_test_seed"


def _stamp_seed(engine: Engine) -> None:
    """The snapshot's rows, dated now: as a load at this instant writes them."""
    from spotbroker.broker.clock import SYSTEM_CLOCK
    from spotbroker.broker.store.models import Offer, PriceOffer

    now = SYSTEM_CLOCK.now()
    with engine.begin() as conn:
        conn.execute(PriceOffer.__table__.update().values(observed_at=now, checked_at=now))
        conn.execute(Offer.__table__.update().values(observed_at=now))


def _restore_seed() -> tuple[str, ...]:
    """What puts the kept snapshot rows back into an emptied PostgreSQL
    database, dated now, its sequences where the load would have left them."""
    from spotbroker.broker.clock import SYSTEM_CLOCK
    from spotbroker.broker.store.db import Base

    now = f"'{SYSTEM_CLOCK.now().isoformat()}'::timestamptz"
    statements = []
    for name in _SEEDED:
        # Dated as they are copied: an UPDATE after doubled the cost.
        columns = [c.name for c in Base.metadata.tables[name].columns]
        values = [now if c in ("observed_at", "checked_at") else c for c in columns]
        statements += [f"INSERT INTO {name} ({', '.join(columns)}) SELECT {', '.join(values)} "
                       f"FROM {_SEED_SCHEMA}.{name}",
                       f"SELECT setval(pg_get_serial_sequence('{name}', 'id'), max(id)) FROM {name}"]
    return tuple(statements)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database of each kind (for a test in `SERVED`,
    holding the price snapshot that its server would load)."""
    served = not SERVED.isdisjoint(request.fixturenames)
    if request.param == "sqlite":
        import shutil

        path = tmp_path / "broker.db"
        template = "sqlite_seeded_template" if served else "sqlite_template"
        shutil.copyfile(request.getfixturevalue(template), path)
        url = f"sqlite:///{path}"
        if served:
            engine = make_engine(url)
            _stamp_seed(engine)
            engine.dispose()
        return url
    url = request.getfixturevalue("pg_database")
    engine = make_engine(url)
    _empty_all(engine, then=_restore_seed() if served else ())
    engine.dispose()
    return url


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def factory(engine: Engine):
    return make_session_factory(engine)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A broker data directory that the user local jobs run as can enter (as
    root they run as an unprivileged user, and pytest's own temporary
    directories are private to the user running the tests)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="spotbroker-test-"))
    path.chmod(0o711)
    yield path / "data"
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def job_scratch() -> Iterator[Path]:
    """A directory that local jobs may write to (tests leave marks there): as
    root, jobs run as a user that can write nowhere else outside their own."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="spotbroker-scratch-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def settings(db_url: str, data_dir: Path):
    from spotbroker.broker.settings import Settings

    return Settings(database_url=db_url, data_dir=data_dir, admin_token=ADMIN_TOKEN,
                    reconcile_interval=0.25, local_kill_grace_seconds=2, local_max_running=8,
                    local_notice_window=5, secret_key="test-signing-key", _env_file=None,
                    preload_skypilot=False)  # seconds of CPU each: tests/api/test_preload.py checks it


@contextmanager
def served(settings, run_reconciler: bool = True) -> Iterator:
    """The app on a real socket (settings.port is set to it), so that node
    agents of local runs can reach it; yields an HTTP client for it."""
    import httpx
    from support.helpers import serve_in_thread

    server, thread = serve_in_thread(settings, run_reconciler=run_reconciler)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{settings.port}", timeout=30) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture
def api(settings) -> Iterator:
    """The full app, reconciler included, and a client for it."""
    with served(settings) as client:
        yield client
    stop_local_nodes(settings.data_dir)


@pytest.fixture
def agent_endpoint(settings) -> Iterator:
    """The API without its reconciler: where agents report while a test
    drives its own reconciler pass by pass."""
    with served(settings, run_reconciler=False) as client:
        yield client
    stop_local_nodes(settings.data_dir)


@pytest.fixture
def team_headers(api) -> Callable[[str], dict[str, str]]:
    """Create a team over the API (admin token) and return its auth header."""

    def make(name: str = "ml") -> dict[str, str]:
        r = api.post("/v1/teams", json={"name": name}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert r.status_code == 201, r.text
        return {"Authorization": f"Bearer {r.json()['token']}"}

    return make

