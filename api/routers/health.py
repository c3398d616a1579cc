"""Liveness and readiness probes (no token needed, nothing secret inside)."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

from spotbroker.api.jsonbody import JSONBodyRoute
from spotbroker.api.schemas import Health, LaunchReadiness
from spotbroker.broker.store import migrate

router = APIRouter(tags=["health"], route_class=JSONBodyRoute)


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    return Health(status="ok")


def launch_readiness(launchers: dict) -> LaunchReadiness | None:
    launcher = launchers.get("skypilot")
    if launcher is None:
        return None
    ready, detail = launcher.readiness()
    return LaunchReadiness(launcher=launcher.name, ready=ready, detail=detail)


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(request: Request):
    engine = request.app.state.engine
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        if not migrate.is_current(engine):
            return JSONResponse(Health(status="unavailable", detail="migrations are behind; run "
                                       "'spotbroker db upgrade'").model_dump(), status_code=503)
    except Exception as exc:
        return JSONResponse(Health(status="unavailable", detail=f"database unreachable: "
                                   f"{type(exc).__name__}").model_dump(), status_code=503)
    # The launcher's state is said, not made a 503: a broker whose SkyPilot is
    # down still serves submissions, cancels, logs and status, and a replica
    # taken out of its Service for it would take the API down with it.
    return Health(status="ok", launch=launch_readiness(request.app.state.launchers))
