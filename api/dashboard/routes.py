"""The dashboard: server-rendered pages of a team's money, under /dashboard.

Log in with a token through the form (a session cookie, see session.py) or
send the bearer header. A team sees its own page; the admin sees every
team's and switches between them. Each page is one broker call
(broker/money/dashboard.py) and a template; the charts are inline SVG, so
a page runs no script and fetches nothing but its own stylesheet, and the
Content-Security-Policy says so.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Annotated
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader

from spotbroker.api.dashboard import charts, session
from spotbroker.broker import auth
from spotbroker.broker.auth import Principal
from spotbroker.broker.jobs import reasons, resfields
from spotbroker.broker.money import dashboard, labels, overview, preflights, views

HERE = Path(__file__).parent
CSP = ("default-src 'self'; script-src 'none'; style-src 'self'; img-src 'self'; font-src 'self'; "
       "connect-src 'none'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
           "Cache-Control": "no-store", "X-Frame-Options": "DENY"}

templates = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True, trim_blocks=True,
                        lstrip_blocks=True)
templates.filters["money"] = charts.money
templates.filters["size"] = charts.size
templates.filters["kwh"] = charts.kwh
templates.filters["kg"] = charts.kg
templates.globals["svg"] = charts.svg

router = APIRouter(prefix="/dashboard", include_in_schema=False)
# Read here, not by FastAPI: a browser given `?days=0` gets a page saying so, not a JSON problem.
Days = Annotated[str, Query(max_length=16, description="how many days back: 1 to 400")]
DAYS_WRONG = "days: a whole number of days from 1 to 400"


def days_back(value: str) -> int | None:
    """The range's days, or None when `value` is not 1 to 400."""
    return int(value) if value.isascii() and value.isdigit() and 1 <= int(value) <= 400 else None


def page(name: str, status: int = 200, **context) -> HTMLResponse:
    return HTMLResponse(templates.get_template(name).render(**context), status_code=status, headers=HEADERS)


def who(request: Request) -> Principal | None:
    """The bearer header (for scripts), else the session cookie."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if header:
        if scheme.lower() != "bearer" or not token.strip():
            return None
        with request.app.state.session_factory() as s:
            return request.app.state.tokens.resolve(s, token.strip())
    return session.read(request)


async def viewer(request: Request) -> AsyncIterator[Principal | None]:
    """Who reads a page (`who`), within one of its team's turns, as on the
    API (`api.deps.get_caller`): a team's 64 reads of a 400-day page at once
    held the others' for seconds."""
    principal = await run_in_threadpool(who, request)
    if principal is None:
        yield None
        return
    async with request.app.state.team_turns.of(principal):
        yield principal


Viewer = Annotated[Principal | None, Depends(viewer, scope="function")]


def to_login() -> RedirectResponse:
    return RedirectResponse("/dashboard/login", status_code=303, headers=HEADERS)


def same_origin(request: Request) -> bool:
    """A form post from a page of this server (a browser sends Origin on
    every POST); a client that sends none is not a browser acting for someone."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.headers.get("host")


@router.get("/static/dashboard.css")
def stylesheet() -> Response:
    return Response((HERE / "static" / "dashboard.css").read_bytes(), media_type="text/css",
                    headers={"Cache-Control": "max-age=3600", "X-Content-Type-Options": "nosniff"})


@router.get("/login")
def login_form(request: Request) -> HTMLResponse:
    return page("login.html", error=None)


def posted_from_here(request: Request) -> bool:
    """A login form posted from a page of this server: its Origin says so,
    else (a browser that sends none) its Referer. A post with neither, or
    from another site, could log a victim's browser into the poster's team
    (login CSRF); scripts send the bearer header and never post this form."""
    origin = request.headers.get("origin")
    if origin is None:
        origin = request.headers.get("referer")
    if origin is None or origin == "null":
        return False
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc == request.headers.get("host")


@router.post("/login")
async def login(request: Request) -> Response:
    if not posted_from_here(request):
        return page("login.html", 403, error="this form is posted from the dashboard's own page only")
    form = parse_qs((await request.body()).decode(errors="replace"))
    token = (form.get("token") or [""])[0].strip()
    if not token:
        return page("login.html", 422, error="token: paste your team's token (or the admin token)")
    response = RedirectResponse("/dashboard", status_code=303, headers=HEADERS)
    principal = await run_in_threadpool(session.issue, request, response, token)
    if principal is None:
        return page("login.html", 401, error="unknown or revoked token")
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    if not same_origin(request):
        return page("error.html", 403, title="Forbidden", detail="log out from the dashboard's own page")
    response = to_login()
    session.clear(request, response)
    return response


@router.get("")
def home(request: Request, principal: Viewer, days: Days = "30") -> Response:
    if principal is None:
        return to_login()
    if not principal.is_admin:
        return RedirectResponse(f"/dashboard/teams/{principal.team_name}", status_code=303, headers=HEADERS)
    days = days_back(days)
    if days is None:
        return page("error.html", 422, title="Invalid request", admin=True, detail=DAYS_WRONG)
    now = request.app.state.clock.now()
    since = now - timedelta(days=days)
    with request.app.state.session_factory() as s:
        day_list, teams = overview.teams(s, since, now)
    rows = [(t.team, t.total.cost, charts.PALETTE[0]) for t in teams]
    return page("overview.html", teams=teams, chart=charts.bars(rows, width=1000), since=since, until=now, days=days,
                admin=True, trends={t.team: charts.sparkline(day_list, t.trend) for t in teams},
                meters={t.team: charts.meter(t.budget.spent, t.budget.amount) for t in teams if t.budget})


@router.get("/teams/{name}")
def team(request: Request, name: str, principal: Viewer, days: Days = "30",
         label: Annotated[str | None, Query(max_length=127, description="the label charted")] = None) -> Response:
    if principal is None:
        return to_login()
    if not auth.TEAM_NAME_RE.fullmatch(name) or (not principal.is_admin and principal.team_name != name):
        return page("error.html", 403, title="Forbidden", detail="a team's token reads its own team only",
                    admin=principal.is_admin)
    if label is not None and not resfields.LABEL_KEY_RE.match(label):
        return page("error.html", 422, title="Invalid request", admin=principal.is_admin,
                    detail="label: a label's name (letters, digits, '.', '_', '-', '/')")
    days = days_back(days)
    if days is None:
        return page("error.html", 422, title="Invalid request", admin=principal.is_admin, detail=DAYS_WRONG)
    now = request.app.state.clock.now()
    since = now - timedelta(days=days)
    try:
        with request.app.state.session_factory() as s:
            data = dashboard.team_page(s, name, since, now, with_teams=principal.is_admin,
                                       settings=session.money_settings(request))
            label_keys, label, by_label = labels.team_chart(s, name, label, since, now)
            waiting = reasons.not_running(s, name)
            flights = preflights.team_preflights(s, name, since)
    except auth.TeamNotFound:
        return page("error.html", 404, title="Not found", detail=f"no team {name!r}", admin=principal.is_admin)
    by_label = charts.stacked_days(data.days, by_label, height=200, muted=(views.NO_LABEL,)) if label else None
    return page("team.html", p=data, now=now, days=days, admin=principal.is_admin, label_keys=label_keys,
                label=label, by_label=by_label, waiting=waiting, preflights=flights, **_charts(data, now))


def _charts(data: dashboard.TeamPage, now) -> dict:
    total = data.total
    money_rows = [("paid", total.cost, "#0072B2"), ("on demand would have cost", total.on_demand_cost, "#999999"),
                  ("saved", max(total.savings, 0.0), "#009E73"), ("wasted on lost work", total.wasted, "#D55E00")]
    return dict(
        by_cloud=charts.stacked_days(data.days, data.by_cloud, height=200),
        by_gpu=charts.stacked_days(data.days, data.by_gpu, height=200),
        kwh_chart=charts.stacked_days(data.days, data.kwh_by_cloud, height=200, unit=charts.kwh),
        co2e_chart=charts.stacked_days(data.days, data.co2e_by_cloud, height=200, unit=charts.kg),
        burn=charts.burn(data.budget, now) if data.budget else None, money_chart=charts.bars(money_rows),
        top=charts.bars([(f"{j.id} {j.name}", j.cost, "#0072B2") for j in data.jobs]),  # (names are not unique)
        timeline=charts.timeline(data.jobs, data.since, now) if data.jobs else None)

from spotbroker.api.dashboard import jobpage as _jobpage  # noqa: E402, F401  (its route, on this router)
