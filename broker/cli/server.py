"""Commands that act on the broker's own database: serve, db, teams."""
from __future__ import annotations

import copy

import click


def get_settings():
    """The broker's settings, loaded only by the commands that act as the
    broker (`teams list` and the other HTTP commands of these groups do not)."""
    from spotbroker.broker.settings import get_settings as load

    return load()


def _replicas_agree(settings, engine) -> None:
    """Refused at the start: a live broker on this database with another
    checkpoint root or advertise address (broker/replicas.py)."""
    from spotbroker.broker import replicas
    from spotbroker.broker.clock import SYSTEM_CLOCK
    from spotbroker.broker.store.db import make_session_factory

    with make_session_factory(engine)() as session:
        said = replicas.disagreements(session, replicas.Shared.of(settings), SYSTEM_CLOCK.now())
    if said:
        raise click.ClickException("brokers on one database must share these settings (docs/deploy.md): "
                                   + "; ".join(said))


def _engine():
    from spotbroker.broker.store.db import make_engine

    return make_engine(get_settings().sqlalchemy_url)


def _ready_engine():
    """An engine whose schema is current (SQLite is migrated on the spot)."""
    from spotbroker.broker.store.migrate import SchemaBehind, prepare

    engine = _engine()
    try:
        prepare(engine, get_settings().data_dir)
    except SchemaBehind as exc:
        raise click.ClickException(str(exc)) from None
    return engine


def _client_url(host: str, port: int) -> str:
    """The address a client on this machine uses: a wildcard listen address
    is no address to connect to."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "[::1]"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def log_config(level: str) -> dict:
    """uvicorn's logging, and the broker's own lines at `level` with their
    time and logger's name. Set before anything is imported: a library that
    configures the root logger on import (SkyPilot does, at INFO) then finds it
    configured and leaves it. uvicorn applies it in each worker process too."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["broker"] = {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    config["handlers"]["broker"] = {"formatter": "broker", "class": "logging.StreamHandler",
                                    "stream": "ext://sys.stderr"}
    config["root"] = {"handlers": ["broker"], "level": level.upper()}
    # Alembic's lines (a plugin's set-up, each migration's whole docstring) are
    # `spotbroker db upgrade`'s to show, not the server's at each start.
    config["loggers"]["alembic"] = {"level": "WARNING"}
    return config


@click.command()
@click.option("--host", default=None, help="address to listen on [default: 127.0.0.1]")
@click.option("--port", default=None, type=int, help="port [default: 8000]")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="server processes (one per core); each also runs a reconciler")
@click.option("--log-level", default="info", show_default=True)
def serve(host: str | None, port: int | None, workers: int, log_level: str) -> None:
    """Run the broker: REST API and reconciler."""
    import logging.config
    import os

    import uvicorn

    logs = log_config(log_level)
    logging.config.dictConfig(logs)
    from spotbroker.api.app import create_app

    settings = get_settings()
    if settings.kubernetes_places:  # read before "serving on": a bad file is a message, not a failed start-up
        from pathlib import Path

        from spotbroker.broker.placement.kubernetes import PlacesFileError, load

        try:
            load(Path(settings.kubernetes_places))
        except PlacesFileError as exc:
            raise click.ClickException(str(exc)) from None
    host = host or settings.host
    port = port if port is not None else settings.port
    settings = settings.model_copy(update={"host": host, "port": port})
    engine = _ready_engine()
    try:
        _replicas_agree(settings, engine)
    finally:
        engine.dispose()
    click.echo(f"spotbroker: serving on http://{host}:{port} (database: "
               f"{settings.sqlalchemy_url.split('@')[-1]}, data: {settings.data_dir}, workers: {workers})",
               err=True)
    if port:  # port 0: the kernel picks one, which is only known once bound
        # The client commands find the broker through this variable alone.
        click.echo(f"spotbroker: in another shell: export SPOTBROKER_URL={_client_url(host, port)}", err=True)
    from spotbroker.api.headlimit import BoundedHead  # a request's head is bounded

    if workers == 1:
        uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level, http=BoundedHead,
                    forwarded_allow_ips=settings.trusted_proxies(host), log_config=logs,
                    timeout_graceful_shutdown=settings.shutdown_grace_seconds)
        return
    # Worker processes build their own app from the environment.
    os.environ.update(SPOTBROKER_HOST=host, SPOTBROKER_PORT=str(port))
    uvicorn.run("spotbroker.api.app:create_app", factory=True, host=host, port=port, workers=workers,
                log_level=log_level, http=BoundedHead, forwarded_allow_ips=settings.trusted_proxies(host),
                log_config=logs, timeout_graceful_shutdown=settings.shutdown_grace_seconds)


@click.group()
def db() -> None:
    """Database schema."""


@db.command()
def upgrade() -> None:
    """Migrate the database to the newest schema."""
    from spotbroker.broker.store import migrate

    engine = _engine()
    if engine.dialect.name == "sqlite":
        get_settings().data_dir.mkdir(parents=True, exist_ok=True)
    migrate.upgrade(engine)
    click.echo(f"database at revision {migrate.current_revision(engine)}")


@db.command()
def ready() -> None:
    """Make the database ready for `serve`, waiting up to SPOTBROKER_DB_WAIT_SECONDS
    for it to answer: migrate it (SPOTBROKER_MIGRATE_ON_START, the default), or,
    where a migration job does that, wait until its schema is this code's."""
    import time

    from sqlalchemy.exc import OperationalError

    from spotbroker.broker.store import migrate
    from spotbroker.broker.store.db import driver_said

    settings = get_settings()
    engine = _engine()
    deadline, said = time.monotonic() + settings.db_wait_seconds, None
    try:
        while True:
            try:
                if settings.migrate_on_start:
                    if engine.dialect.name == "sqlite":
                        settings.data_dir.mkdir(parents=True, exist_ok=True)
                    migrate.upgrade(engine)
                if migrate.is_current(engine):
                    click.echo(f"database ready at revision {migrate.current_revision(engine)}", err=True)
                    return
                why = (f"the schema is at {migrate.current_revision(engine) or 'nothing'} and this broker needs "
                       f"{migrate.head_revision()}: waiting for 'spotbroker db upgrade' (the "
                       "migration job)")
            except OperationalError as exc:  # not reachable yet; any other error is not waited out
                why = f"the database does not answer: {driver_said(exc)}"
            if time.monotonic() >= deadline:
                raise click.ClickException(f"{why} (gave up after SPOTBROKER_DB_WAIT_SECONDS="
                                           f"{settings.db_wait_seconds:g})")
            if why != said:
                click.echo(f"spotbroker: {why}", err=True)
                said = why
            time.sleep(1)
    finally:
        engine.dispose()


@db.command()
def current() -> None:
    """Print the schema revision of the database and of this code."""
    from spotbroker.broker.store import migrate

    engine = _engine()
    click.echo(f"database: {migrate.current_revision(engine) or 'empty'}; "
               f"code: {migrate.head_revision()}")


@db.command()
def reseal() -> None:
    """Seal every stored secret with the current key (the first of
    SPOTBROKER_ENCRYPTION_KEYS), so that older keys can be dropped."""
    from spotbroker.broker.store import sealing
    from spotbroker.broker.store.db import make_session_factory
    from spotbroker.broker.usecases.reseal import reseal as reseal_all

    engine = _ready_engine()
    keyring = sealing.keyring(get_settings())
    done = reseal_all(make_session_factory(engine), keyring)
    click.echo(f"resealed with key {keyring.current}: {done.jobs} jobs, {done.budgets} budgets")
    if done.unreadable:
        raise click.ClickException("these do not open with this broker's keys and were left as they are:\n  "
                                   + "\n  ".join(done.unreadable))
