"""Logging in to the dashboard: the session cookie is HTTP-only,
SameSite=Strict, limited to /dashboard, a signed id of a session stored
server-side (logout, idling, its lifetime and its token's revocation end
it everywhere), and never accepted by /v1; the bearer header works for scripts; a
team sees only its own page; every page sends a strict CSP."""
from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import func, select
from support.site import ADMIN

from spotbroker.api.dashboard import session
from spotbroker.broker import auth
from spotbroker.broker.auth import sessions
from spotbroker.broker.money.settings import MoneySettings
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import ApiToken, Team
from spotbroker.broker.store.moneymodels import DashboardSession


def log_in(site, token: str, origin: str | None = None) -> httpx.Response:
    headers = {"Origin": origin or site.url}
    return site.client.post("/dashboard/login", data={"token": token}, headers=headers)


def test_a_login_post_is_taken_only_from_the_dashboards_own_page(site):
    """A login form posted from another site (login CSRF: the victim's browser
    logged into the poster's team) is refused whatever it sends: another
    Origin, "null", another Referer, or no header at all. A browser whose
    Origin is left out sends its Referer, from this server's page."""
    refused = [{}, {"Origin": "null"}, {"Origin": "https://evil.example"}, {"Referer": "https://evil.example/x"},
               {"Referer": f"{site.url}.evil.example/dashboard/login"}, {"Referer": "not a url"},
               {"Origin": "https://evil.example", "Referer": f"{site.url}/dashboard/login"}]
    for headers in refused:
        r = site.client.post("/dashboard/login", data={"token": site.tokens["ml"]}, headers=headers)
        assert r.status_code == 403 and "set-cookie" not in r.headers, headers
    r = site.client.post("/dashboard/login", data={"token": site.tokens["ml"]},
                         headers={"Referer": f"{site.url}/dashboard/login"})
    assert r.status_code == 303 and session.COOKIE in r.cookies
    site.client.cookies.clear()
    r = httpx.get(f"{site.url}/dashboard/teams/ml", headers={"Authorization": f"Bearer {site.tokens['ml']}"})
    assert r.status_code == 200  # a script: the bearer header, no form


def cookie_of(r: httpx.Response) -> str:
    (line,) = [v for k, v in r.headers.multi_items() if k == "set-cookie"]
    return line


def test_login_sets_a_strict_http_only_cookie_that_v1_refuses(site):
    r = site.client.get("/dashboard")
    assert r.status_code == 303 and r.headers["location"] == "/dashboard/login"
    r = log_in(site, site.tokens["ml"])
    assert r.status_code == 303 and r.headers["location"] == "/dashboard"
    line = cookie_of(r).lower()
    assert "httponly" in line and "samesite=strict" in line and "path=/dashboard" in line
    assert "secure" not in line                                   # plain http here (see the https test)
    assert site.tokens["ml"] not in cookie_of(r)                  # the token itself is never in it
    cookie = {session.COOKIE: site.client.cookies[session.COOKIE]}
    site.client.cookies.clear()
    r = httpx.get(f"{site.url}/dashboard", cookies=cookie, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/dashboard/teams/ml"
    page = httpx.get(f"{site.url}/dashboard/teams/ml", cookies=cookie)
    assert page.status_code == 200 and "Team ml" in page.text
    # /v1 takes the bearer header only: the cookie, even sent there, is no credential.
    for path in ("/v1/teams/ml/costs", "/v1/jobs", "/v1/whoami"):
        r = httpx.get(f"{site.url}{path}", headers={"Cookie": f"{session.COOKIE}={cookie[session.COOKIE]}"})
        assert r.status_code == 401, (path, r.text)
    # Another team's page: refused alike whether it exists or not.
    for name in ("vision", "nobody"):
        assert httpx.get(f"{site.url}/dashboard/teams/{name}", cookies=cookie).status_code == 403


def test_a_bad_token_a_forged_cookie_a_cross_site_post_and_a_revoked_token_get_nothing(site, factory):
    r = log_in(site, "sbt_not-a-token")
    assert r.status_code == 401 and "unknown or revoked token" in r.text and "set-cookie" not in r.headers
    r = log_in(site, site.tokens["ml"], origin="https://evil.example")
    assert r.status_code == 403 and "set-cookie" not in r.headers
    assert log_in(site, "").status_code == 422
    good = log_in(site, site.tokens["ml"])
    value = good.cookies[session.COOKIE]
    session_id, signature = value.split(".")
    other = log_in(site, site.tokens["vision"]).cookies[session.COOKIE]
    forged = other.split(".")[0] + "." + signature                # vision's session, under ml's signature
    for bad in (forged, value[:-2], "x", value + ".y", "." + signature, session_id + "."):
        r = httpx.get(f"{site.url}/dashboard/teams/ml", cookies={session.COOKIE: bad})
        assert r.status_code == 303, bad
    assert httpx.get(f"{site.url}/dashboard/teams/ml", cookies={session.COOKIE: value}).status_code == 200
    with transaction(factory) as s:
        s.query(ApiToken).filter(ApiToken.digest == auth.digest(site.tokens["ml"])).update(
            {"revoked_at": datetime.now(UTC)})
    r = httpx.get(f"{site.url}/dashboard/teams/ml", cookies={session.COOKIE: value})
    assert r.status_code == 303                                   # its token revoked: the session ends
    with factory() as s:                                          # and is gone, not merely refused
        assert s.scalar(select(func.count()).select_from(DashboardSession)
                        .where(DashboardSession.digest == hashlib.sha256(session_id.encode()).hexdigest())) == 0


def test_a_cookie_copied_before_logout_is_worth_nothing_after_it(site, factory):
    """Logging out ends the session on the server: a copy of the cookie (a
    stolen one, another tab's) no longer opens a page."""
    r = log_in(site, site.tokens["ml"])
    stolen = {session.COOKIE: r.cookies[session.COOKIE]}
    assert httpx.get(f"{site.url}/dashboard/teams/ml", cookies=stolen).status_code == 200
    r = site.client.post("/dashboard/logout", headers={"Origin": site.url})
    assert r.status_code == 303
    r = httpx.get(f"{site.url}/dashboard/teams/ml", cookies=stolen, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/dashboard/login"
    # The table holds digests only: the cookie's id is nowhere in it.
    log_in(site, site.tokens["ml"])
    with factory() as s:
        rows = s.execute(select(DashboardSession)).scalars().all()
    assert len(rows) == 1 and rows[0].api_token_id is not None
    assert site.client.cookies[session.COOKIE].split(".")[0] not in repr(vars(rows[0]))


def test_a_session_ends_when_idle_and_at_its_absolute_lifetime(site):
    settings = MoneySettings(_env_file=None)
    idle = timedelta(seconds=settings.dashboard_idle_seconds)
    lifetime = timedelta(seconds=settings.dashboard_lifetime_seconds)
    cookie = {session.COOKIE: log_in(site, site.tokens["ml"]).cookies[session.COOKIE]}

    def opens() -> bool:
        return httpx.get(f"{site.url}/dashboard/teams/ml", cookies=cookie).status_code == 200

    start = site.clock.now()
    while site.clock.now() + idle * 0.9 < start + lifetime:       # used often enough: it stands
        site.clock.advance(seconds=idle.total_seconds() * 0.9)
        assert opens(), site.clock.now() - start
    site.clock.t = start + lifetime                                # however used, it ends at its lifetime
    assert not opens()
    cookie = {session.COOKIE: log_in(site, site.tokens["ml"]).cookies[session.COOKIE]}
    assert opens()
    site.clock.advance(seconds=idle.total_seconds() + 1)           # left unused longer than idle: it ends
    assert not opens()
    site.clock.advance(seconds=-idle.total_seconds() - 1)          # and stays ended (the row is gone)
    assert not opens()


def test_a_short_idle_time_keeps_a_session_in_use(factory):
    """Below a minute (SPOTBROKER_MONEY_DASHBOARD_IDLE_SECONDS=6), a session
    in use every 2 s ended 6 s after its login: its use was written once a minute."""
    now = datetime(2026, 3, 2, tzinfo=UTC)
    idle = timedelta(seconds=6)
    with transaction(factory) as s:
        session_id, who = sessions.open_session(s, "admin-one", "admin-one", now, timedelta(hours=8))
    for step in range(1, 10):
        with transaction(factory) as s:
            assert sessions.resolve(s, session_id, "admin-one", now + timedelta(seconds=2 * step), idle) == who, step


def test_a_changed_admin_token_ends_the_admins_sessions(factory):
    now = datetime(2026, 3, 2, tzinfo=UTC)
    with transaction(factory) as s:
        session_id, who = sessions.open_session(s, "admin-one", "admin-one", now, timedelta(hours=8))
    assert who.is_admin
    with transaction(factory) as s:
        assert sessions.resolve(s, session_id, "admin-one", now, timedelta(hours=1)) == who
        assert sessions.resolve(s, session_id, "admin-two", now, timedelta(hours=1)) is None
    with transaction(factory) as s:
        assert sessions.resolve(s, session_id, "admin-one", now, timedelta(hours=1)) is None
        assert sessions.open_session(s, "admin-one", "admin-two", now, timedelta(hours=8)) is None


def test_logout_clears_the_cookie_and_the_bearer_header_works_for_scripts(site):
    log_in(site, site.tokens["ml"])
    assert site.client.get("/dashboard/teams/ml").status_code == 200
    r = site.client.post("/dashboard/logout", headers={"Origin": site.url})
    assert r.status_code == 303 and session.COOKIE not in site.client.cookies
    assert site.client.get("/dashboard/teams/ml").status_code == 303
    with httpx.Client(base_url=site.url) as script:
        assert script.get("/dashboard/teams/ml", headers=site.bearer("ml")).status_code == 200
        assert script.get("/dashboard/teams/vision", headers=site.bearer("ml")).status_code == 403
        assert script.get("/dashboard/teams/ml", headers={"Authorization": "Bearer nope"}).status_code == 303
        admin = script.get("/dashboard", headers=ADMIN)
        assert admin.status_code == 200 and "/dashboard/teams/vision" in admin.text
        assert script.get("/dashboard/teams/nobody", headers=ADMIN).status_code == 404
        for path in ("/dashboard/teams/ml?days=0", "/dashboard/teams/ml?days=abc", "/dashboard?days=401",
                     "/dashboard/teams/ml?days=%D9%A3"):  # (a browser got a JSON problem; Arabic-Indic 3 too)
            r = script.get(path, headers=ADMIN)
            assert r.status_code == 422 and r.headers["content-type"].startswith("text/html"), path
            assert "days: a whole number of days from 1 to 400" in r.text, path
        assert script.get("/dashboard/teams/ml?days=7", headers=ADMIN).status_code == 200


def test_every_page_sends_a_csp_without_inline_script(site):
    for path, headers in (("/dashboard/login", {}), ("/dashboard", ADMIN), ("/dashboard/teams/ml", ADMIN)):
        r = site.client.get(path, headers=headers)
        assert r.status_code == 200, path
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'none'" in csp and "unsafe-inline" not in csp
        assert r.headers["x-frame-options"] == "DENY" and "<script" not in r.text.replace("&lt;script", "")
    css = site.client.get("/dashboard/static/dashboard.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")


def test_the_cookie_is_secure_when_reached_over_https(settings):
    from fastapi.testclient import TestClient

    from spotbroker.api.app import create_app

    with TestClient(create_app(settings, run_reconciler=False), base_url="https://broker.example") as client:
        r = client.post("/dashboard/login", data={"token": settings.admin_token.get_secret_value()},
                        headers={"Origin": "https://broker.example"}, follow_redirects=False)
        assert r.status_code == 303
        line = cookie_of(r).lower()
        assert "secure" in line and "httponly" in line and "samesite=strict" in line


def test_a_token_keeps_a_bounded_number_of_logins_open(factory):
    """A token's holder opened 3,000 dashboard sessions in 23 s, each a row kept
    for the sessions' lifetime: now the oldest ends when one more opens."""
    with transaction(factory) as s:
        team, token = auth.create_team(s, "ml")
    now = datetime(2026, 3, 2, tzinfo=UTC)
    opened = []
    for i in range(sessions.MAX_PER_TOKEN + 5):
        with transaction(factory) as s:
            opened.append(sessions.open_session(s, token, "admin-one", now + timedelta(seconds=i),
                                                timedelta(hours=8))[0])
        with transaction(factory) as s:  # the admin's are counted apart
            sessions.open_session(s, "admin-one", "admin-one", now, timedelta(hours=8))
    with factory() as s:
        rows = s.scalar(select(func.count()).select_from(DashboardSession).where(
            DashboardSession.api_token_id.is_not(None)))
        admins = s.scalar(select(func.count()).select_from(DashboardSession).where(
            DashboardSession.api_token_id.is_(None)))
    assert (rows, admins) == (sessions.MAX_PER_TOKEN, sessions.MAX_PER_TOKEN)
    at = now + timedelta(seconds=sessions.MAX_PER_TOKEN + 5)
    with transaction(factory) as s:
        assert sessions.resolve(s, opened[0], "admin-one", at, timedelta(hours=1)) is None  # the oldest: ended
        assert sessions.resolve(s, opened[-1], "admin-one", at, timedelta(hours=1)).team_name == "ml"


def test_a_rotation_ends_the_old_tokens_logins_and_keeps_few_revoked_rows(factory):
    """The bound was per token row: rotating its own token 20 times, 50 logins
    each, left 1,000 session rows, and every rotation a token row kept for ever."""
    with transaction(factory) as s:
        team, token = auth.create_team(s, "ml")
    now = datetime(2026, 3, 2, tzinfo=UTC)
    for _ in range(auth.KEPT_REVOKED + 10):
        for i in range(5):
            with transaction(factory) as s:
                sessions.open_session(s, token, None, now + timedelta(seconds=i), timedelta(hours=8))
        with transaction(factory) as s:
            token = auth.rotate_tokens(s, s.get(Team, team.id))
    with factory() as s:
        logins = s.scalar(select(func.count()).select_from(DashboardSession))
        kept = s.scalar(select(func.count()).select_from(ApiToken).where(ApiToken.team_id == team.id))
    assert logins == 0  # each rotation ended the old token's logins
    assert kept == auth.KEPT_REVOKED + 1  # the newest revoked ones, and the working one
    with transaction(factory) as s:
        assert sessions.open_session(s, token, None, now, timedelta(hours=8)) is not None
