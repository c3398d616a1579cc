"""/metrics for Prometheus: the deployment's totals (cost per team, burn
rate, budget remaining, jobs by state, preemptions, recoveries, checkpoint
flush seconds, placement decisions, reconciler lag, price freshness:
broker/metrics/collector.py reads them from the database at scrape time, in the
one broker that holds the metrics lease) and this process's own (HTTP
requests, CPU, memory: api/http_metrics.py). Scraped with `SPOTBROKER_METRICS_TOKEN` or the admin
token, as a bearer token: the numbers name every team, so a team's token
is refused (403), and no token at all is a 401."""
from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from spotbroker.api.errors import Problem, responses
from spotbroker.api.jsonbody import JSONBodyRoute
from spotbroker.broker.money.settings import get_money_settings

router = APIRouter(tags=["metrics"], route_class=JSONBodyRoute)
_bearer = HTTPBearer(auto_error=False, description="SPOTBROKER_METRICS_TOKEN, or the admin token")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


async def may_scrape(request: Request,
                     creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise Problem(401, "Unauthorized", "send 'Authorization: Bearer <SPOTBROKER_METRICS_TOKEN>'",
                      headers=_CHALLENGE)
    wanted = get_money_settings().metrics_token
    if wanted is not None and hmac.compare_digest(creds.credentials.encode(), wanted.get_secret_value().encode()):
        return
    tokens = request.app.state.tokens
    known, principal = tokens.cached(creds.credentials)
    if not known:
        def look_up():
            with request.app.state.session_factory() as session:
                return tokens.resolve(session, creds.credentials)

        principal = await run_in_threadpool(look_up)
    if principal is None:
        raise Problem(401, "Unauthorized", "unknown or revoked token", headers=_CHALLENGE)
    if not principal.is_admin:
        raise Problem(403, "Forbidden", "the metrics name every team: scrape with SPOTBROKER_METRICS_TOKEN "
                                        "or the admin token")


@router.get("/metrics", dependencies=[Depends(may_scrape)], response_class=Response, responses={
    200: {"description": "Prometheus text exposition format",
          "content": {"text/plain": {"schema": {"type": "string"}}}},
    **responses(401, 403, s401="No token, or an unknown one",
                s403="A team's token (the metrics name every team)")})
def metrics(request: Request) -> Response:
    """Every team's money, jobs, preemptions, flushes and placements, as Prometheus reads them."""
    return Response(generate_latest(request.app.state.metrics_registry), media_type=CONTENT_TYPE_LATEST)
