"""The FastAPI application: wires settings, database, launchers and the
reconciler together. `create_app()` is what `spotbroker serve` runs."""
from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI

from spotbroker.api import errors
from spotbroker.api.batching import SubmissionBatcher
from spotbroker.api.dashboard import routes as dashboard
from spotbroker.api.deps import TeamTurns, body_holder
from spotbroker.api.following import Followers, on_shutdown_signal
from spotbroker.api.guard import Guard
from spotbroker.api.http_metrics import RequestMetrics, process_registry
from spotbroker.api.routers import (
    agent,
    budgets,
    costs,
    health,
    job_metrics,
    jobs,
    metrics,
    prices,
    storage,
    teams,
    uploads,
)
from spotbroker.broker import background
from spotbroker.broker.auth import TokenResolver
from spotbroker.broker.clock import SYSTEM_CLOCK, Clock
from spotbroker.broker.jobs.logimport import import_disk_logs
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.jobs.uploads import receiving_dir
from spotbroker.broker.launch.local import LocalLauncher
from spotbroker.broker.metrics.collector import MoneyCollector
from spotbroker.broker.money.settings import get_money_settings
from spotbroker.broker.pricing.known import KnownAccelerators
from spotbroker.broker.pricing.offers import seed_from_catalog
from spotbroker.broker.reconciler import Reconciler
from spotbroker.broker.settings import Settings, get_settings
from spotbroker.broker.store import migrate, sealing
from spotbroker.broker.store.db import make_engine, make_session_factory, transaction

log = logging.getLogger("spotbroker")


ROUTERS = (health.router, jobs.router, job_metrics.router, teams.router, storage.router, agent.router,
           uploads.router, prices.router, costs.router, budgets.router, dashboard.router, metrics.router)


def create_app(settings: Settings | None = None, *, clock: Clock = SYSTEM_CLOCK,
               run_reconciler: bool = True) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine = make_engine(settings.sqlalchemy_url)
        keyring = sealing.keyring(settings)
        migrate.prepare(engine, settings.data_dir, keyring)
        factory = make_session_factory(engine)
        with transaction(factory) as session:
            seed_from_catalog(session, clock)
        import_disk_logs(factory, settings.data_dir)  # logs a broker kept on its disk before 0013
        launchers = {}
        if settings.local_launcher_enabled():
            launchers["local"] = LocalLauncher.from_settings(settings)
        elif settings.local_launcher is None:  # off by default, not by the operator: say why
            log.warning("the local launcher is off (the server listens beyond loopback); "
                        "set SPOTBROKER_LOCAL_LAUNCHER=true to run jobs on this host")
        for warning in settings.replica_warnings():
            log.warning("%s", warning)
        reconciler = Reconciler(factory, launchers, settings, clock=clock)
        app.state.settings, app.state.engine, app.state.session_factory = settings, engine, factory
        app.state.clock, app.state.reconciler, app.state.launchers = clock, reconciler, launchers
        app.state.keyring = keyring
        app.state.receiving_dir = receiving_dir(settings)  # (what a killed broker was receiving is removed)
        k8s = reconciler.placer.kubernetes
        app.state.accelerators = KnownAccelerators(
            factory, also=(n.accelerator for c in (k8s.clusters if k8s else ()) for n in c.nodes))
        # the deployment's totals: exported by the broker holding the metrics lease (see its module)
        deployment = MoneyCollector(factory, clock, hold_s=get_money_settings().lease_seconds)
        app.state.metrics_registry.register(deployment)
        app.state.batcher = SubmissionBatcher(factory, clock, on_written=reconciler.hint, keyring=keyring)
        app.state.tokens = TokenResolver(settings.admin_token.get_secret_value() if settings.admin_token else None)
        app.state.team_turns = TeamTurns(settings.max_requests_per_team)
        # A team checks one archive and parses one task file at a time (each takes seconds of CPU).
        app.state.upload_turns, app.state.parse_turns = TeamTurns(1), TeamTurns(1)
        app.state.followers = Followers(factory, per_team=settings.max_followers_per_team, clock=clock)
        restore_signals = on_shutdown_signal(app.state.followers)
        # Every thread beside the API, from one list (broker/background.py); routers start none.
        duties, parts = background.duties(settings, factory, launchers, reconciler, clock=clock, keyring=keyring,
                                          run_reconciler=run_reconciler)
        app.state.money, app.state.price_tracker = parts["money"], parts["prices"]
        work = background.Background(duties)
        work.start()
        try:
            yield
        finally:
            app.state.followers.close()
            restore_signals()
            work.stop()
            app.state.metrics_registry.unregister(deployment)
            try:
                deployment.release()
            except Exception:  # the database may be gone at shutdown; the lease then expires
                log.warning("metrics: the lease could not be given up; it expires in %g s", deployment.hold_s)
            engine.dispose()

    app = FastAPI(title="spotbroker", version="0.1.0", lifespan=lifespan,
                  description="Run ML training on spot GPUs at the lowest expected cost.")
    errors.install(app)
    app.add_middleware(Guard, body_timeout_s=settings.body_timeout_seconds,
                       max_in_flight=settings.max_body_bytes_in_flight, identify=body_holder(app))
    app.state.metrics_registry = process_registry()
    app.add_middleware(RequestMetrics, registry=app.state.metrics_registry)  # outermost: every answer counts
    # The routers' own routes, not copies: `include_router` builds every route
    # again for each app it is given (FastAPI analyses each endpoint and its
    # models on the app's first request, ~50 ms), and a process may make many
    # apps (the suite makes one per test server). The routers take no include
    # options (prefix, tags and dependencies are their own), so nothing differs.
    app.router.routes.extend(route for router in ROUTERS for route in router.routes)
    # The request body is parsed by hand (JSON or YAML), and errors are
    # answered by handlers: publish both schemas.
    _publish_schema(app, JobSpec)
    _publish_schema(app, errors.ProblemDoc)
    return app


def _publish_schema(app: FastAPI, model) -> None:
    original = app.openapi

    def openapi():
        if app.openapi_schema:
            return app.openapi_schema
        schema = original()
        defs = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(defs.pop("$defs", {}))
        components[model.__name__] = defs
        return schema

    app.openapi = openapi
