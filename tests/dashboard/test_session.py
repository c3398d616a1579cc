"""Logging in to the dashboard: the session cookie is HTTP-only,
SameSite=Strict, limited to /dashboard, signed, bound to a token that still
stands, and never accepted by /v1; the bearer header works for scripts; a
team sees only its own page; every page sends a strict CSP."""
from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx
from dashboard.conftest import ADMIN

from spotbroker.api.dashboard import session
from spotbroker.broker import auth
from spotbroker.broker.store.db import transaction
from spotbroker.broker.store.models import ApiToken


def log_in(site, token: str, origin: str | None = None) -> httpx.Response:
    headers = {"Origin": origin or site.url}
    return site.client.post("/dashboard/login", data={"token": token}, headers=headers)


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
    body, signature = value.split(".")
    claim = json.loads(session._unb64(body))
    claim["t"] += 1                                                # vision's token, under ml's signature
    forged = session._b64(json.dumps(claim, separators=(",", ":")).encode()) + "." + signature
    for bad in (forged, value[:-2], "x", value + ".y"):
        r = httpx.get(f"{site.url}/dashboard/teams/ml", cookies={session.COOKIE: bad})
        assert r.status_code == 303, bad
    assert httpx.get(f"{site.url}/dashboard/teams/ml", cookies={session.COOKIE: value}).status_code == 200
    with transaction(factory) as s:
        s.query(ApiToken).filter(ApiToken.digest == auth.digest(site.tokens["ml"])).update(
            {"revoked_at": datetime.now(UTC)})
    r = httpx.get(f"{site.url}/dashboard/teams/ml", cookies={session.COOKIE: value})
    assert r.status_code == 303                                   # its token revoked: the session ends


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
        assert script.get("/dashboard/teams/ml?days=0", headers=ADMIN).status_code == 422


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
