"""Small helpers for tests (imported as `support.helpers`: pytest puts tests/ on the path)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from spotbroker.agent.proctree import kill_tree, start_time
from spotbroker.broker.recovery.agent_channel import agent_token

PG_ADMIN_URL = os.environ.get("SPOTBROKER_TEST_PG_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def wait_for(predicate: Callable[[], object], timeout: float = 20, interval: float = 0.25,
             what: str = "condition") -> object:
    """`predicate()`'s first true value, asked at once, then after 20 ms,
    growing by half each time to `interval`: a short wait ends as soon as it
    can, and a long one does not spend the cores its test waits for (a job's
    GET every 50 ms, 4 ms of CPU each, was 8 % of a core per waiting test)."""
    deadline = time.monotonic() + timeout
    pause = min(0.02, interval)
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(pause)
        pause = min(pause * 1.5, interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def once_per_run(tmp_path_factory, name: str, compute: Callable[[], str]) -> str:
    """`compute()`, run once for the whole run whichever xdist worker asks
    first (the others wait for it and read its answer): for a reference
    result that the tests of a file spread over the workers share, such as
    an uninterrupted training's final loss (a torch start, seconds of CPU)."""
    import fcntl

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's, above each worker's own
    answer = root / f"{name}.once"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if answer.exists():
            return answer.read_text()
        value = compute()  # raises: nothing kept, the next test tries again
        answer.write_text(value)
        return value


def wait_state(api, headers, job_id: int, states: set[str], timeout: float = 20) -> dict:
    def reached():
        job = api.get(f"/v1/jobs/{job_id}", headers=headers).json()
        return job if job["state"] in states else None

    try:
        return wait_for(reached, timeout, what=f"job {job_id} to reach {sorted(states)}")
    except AssertionError as exc:  # what the job went through, to read a failure on a loaded machine afterwards
        raise AssertionError(f"{exc}; its events:\n{timeline(api, headers, job_id)}") from None


def timeline(api, headers, job_id: int) -> str:
    """The job's events, one line each: what a failed end-to-end assertion
    shows, so that a run that went wrong once can be read afterwards."""
    events = api.get(f"/v1/jobs/{job_id}/events", headers=headers).json()["events"]
    keep = ("to", "reason", "node", "kind", "exit_code", "signal", "step", "deadline")
    return "\n".join(f"{e['at']} attempt={e['attempt_id']} {e['type']} "
                     f"{ {k: v for k, v in e['data'].items() if k in keep} }" for e in events)


def create_pg_database(prefix: str = "spotbroker_test") -> str:
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
            # A test's database outlives no crash: its commits need not wait for the disk.
            conn.execute(text(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
    finally:
        admin.dispose()
    return make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)


def drop_pg_database(url: str) -> None:
    name = make_url(url).database
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def tgz(**files: bytes) -> bytes:
    """A gzipped tar of regular files, as a workdir upload's body."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def stop_local_nodes(data_dir: Path, grace: float = 15.0) -> None:
    """Stop every node the local launcher started under `data_dir` (they
    outlive the broker by design, and an agent whose broker is gone keeps
    trying to deliver), and wait for them to end before the directory goes:
    a test leaves no process behind. A node is found by its command line as
    well as by its `.self` file, which one that has just started has not
    written yet. Each node ends its whole tree; one that does not within
    `grace` is killed with it."""
    nodes = _local_nodes(Path(data_dir))
    for pid, start in nodes:
        if start_time(pid) == start:  # the same process, not a reused pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(start_time(pid) == start for pid, start in nodes) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid, start in nodes:
        if start_time(pid) == start:
            kill_tree(pid)


def _local_nodes(data_dir: Path) -> set[tuple[int, str]]:
    found = set()
    for self_file in data_dir.glob("runs/*/node-*.self"):
        with contextlib.suppress(OSError, ValueError):
            pid, start = self_file.read_text().split()
            found.add((int(pid), start))
    runs = f"{data_dir}/runs/".encode()
    for pid, argv in processes("cmdline"):
        if b"spotbroker.broker.launch.local_node" in argv and any(a.startswith(runs) for a in argv):
            if start := start_time(pid):
                found.add((pid, start))
    return found


def processes(field: str) -> Iterator[tuple[int, list[bytes]]]:
    """(pid, /proc/PID/`field` split at its NULs: `cmdline`, `environ`) of
    every process this user can read; one gone meanwhile is left out."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                yield int(entry.name), Path(entry.path, field).read_bytes().split(b"\0")
            except OSError:
                continue


# --- speaking as a job's agent ---------------------------------------------------------


def ev(seq: int, event_type: str, **data) -> dict:
    """One agent event, as the agent sends it."""
    return {"seq": seq, "type": event_type, "at": datetime.now(UTC).isoformat(), "data": data}


def counted(rule: dict, extra: dict, data: dict) -> dict:
    """A metrics event's data as the trainer's library writes it under `rule`:
    with the early-stop standing it counts over every report into `extra`
    (the state a checkpoint carries; one dict per run)."""
    from spotbroker.agent.checkpoint.reports import Rule

    library = Rule.from_env(json.dumps(rule))
    value = data["values"].get(library.metric)
    standing = library.count(extra, data["step"], value) if value is not None else None
    return {**data, **({"early_stop": standing} if standing else {})}


def post(api, token: str, *events: dict):
    return api.post("/v1/agent/events", json={"events": list(events)}, headers={"Authorization": f"Bearer {token}"})


def running_job(api, h, settings) -> tuple[dict, str]:
    """A job whose attempt runs, and that attempt's agent token."""
    job_id = api.post("/v1/jobs", json={"run": "sleep 60"}, headers=h).json()["id"]
    job = wait_state(api, h, job_id, {"RUNNING"}, timeout=60)  # a loaded machine starts jobs slowly
    return job, agent_token(settings.signing_key(), job["attempts"][-1]["id"])


def serve_in_thread(settings, **app_kwargs):
    """The app (`create_app(settings, **app_kwargs)`) on a real socket, in a
    thread; settings.port is set to it, so that local nodes' agents reach it.
    (server, thread): set `server.should_exit` and join the thread to stop it."""
    import socket
    import threading

    import uvicorn

    from spotbroker.api.app import create_app

    # The socket is bound here and handed over: a port picked, closed and bound
    # again by the server was once taken in between ("address already in use").
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    settings.port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings, **app_kwargs), host="127.0.0.1",
                                           port=settings.port, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.02)
    return server, thread


def setting_names() -> set[str]:
    """Every environment variable the broker reads as a setting (SPOTBROKER_*):
    what a deployment file (compose, Kubernetes) may set."""
    from pydantic_settings import BaseSettings

    from spotbroker.broker.money.settings import MoneySettings
    from spotbroker.broker.pricing.settings import PricingSettings
    from spotbroker.broker.settings import Settings

    names: set[str] = set()
    for model in (Settings, MoneySettings, PricingSettings):
        assert issubclass(model, BaseSettings)
        prefix = model.model_config["env_prefix"]
        for name, field in model.model_fields.items():
            alias = field.validation_alias
            names.add(alias if isinstance(alias, str) else f"{prefix}{name}".upper())
    return names


def submit(factory, team_id: int, **spec) -> int:
    """A job stored as the API stores one (its spec validated), in the session factory's database."""
    from spotbroker.broker.jobs.spec import JobSpec
    from spotbroker.broker.store.db import transaction
    from spotbroker.broker.usecases import jobs

    with transaction(factory) as s:
        return jobs.submit(s, team_id, JobSpec.model_validate(spec)).id


def team_token(api, name: str, admin_token: str) -> str:
    """A new team's token, from the admin's `POST /v1/teams` on the test client `api`."""
    r = api.post("/v1/teams", json={"name": name}, headers={"Authorization": f"Bearer {admin_token}"})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def spend_today(settings, team: str, dollars: float) -> None:
    """A job of the team that ran one minute ago for a minute, costing `dollars`
    (in the database of `settings`): what puts a team over a day's budget."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import select

    from spotbroker.broker.store.db import make_engine, make_session_factory, transaction
    from spotbroker.broker.store.models import Attempt, Job, Team

    engine = make_engine(settings.sqlalchemy_url)
    end = datetime.now(UTC) - timedelta(seconds=30)
    start = end - timedelta(minutes=1)
    with transaction(make_session_factory(engine)) as s:
        job = Job(team_id=s.scalar(select(Team.id).where(Team.name == team)), name="spent", state="SUCCEEDED",
                  spec={"name": "spent", "run": "true"}, restarts=0, recoveries=0, created_at=start, updated_at=end,
                  ended_at=end)
        s.add(job)
        s.flush()
        s.add(Attempt(job_id=job.id, state="SUCCEEDED", launcher="local", cloud="aws", region="us-east-1",
                      use_spot=False, num_nodes=1, price_per_hour=dollars * 60, created_at=start, updated_at=end,
                      started_at=start, ended_at=end, end_reason="succeeded", released=True, accelerator_count=0))
    engine.dispose()


def run_to_end(factory, settings, job_id: int, timeout: float = 30.0) -> str:
    """Drive a reconciler with the local launcher, pass by pass, until the job
    succeeds or fails (or `timeout` seconds pass); the job's state then."""
    from spotbroker.broker.clock import Clock
    from spotbroker.broker.launch.local import LocalLauncher
    from spotbroker.broker.reconciler import Reconciler
    from spotbroker.broker.store.models import Job

    rec = Reconciler(factory, {"local": LocalLauncher(settings.data_dir, 1)}, settings, clock=Clock())
    deadline = time.monotonic() + timeout
    while True:
        rec.pass_once()
        with factory() as s:
            state = s.get(Job, job_id).state
        if state in ("SUCCEEDED", "FAILED") or time.monotonic() > deadline:
            return state
        time.sleep(0.05)
