"""Every /v1 route, taken from the OpenAPI document (so a new route is
covered the day it is added): without a token, with a wrong one, with
another team's. And no token, whoever sent it, in a log line or in the
database in clear."""
from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import httpx
from conftest import ADMIN_TOKEN
from sqlalchemy import MetaData, select
from support.helpers import tgz, wait_state

from spotbroker.broker.recovery.agent_channel import agent_token
from spotbroker.broker.store.db import make_engine
from spotbroker.broker.store.models import Checkpoint

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
# Admin-only routes outside /v1/teams: a team's token gets 403 (docs/money.md:
# budgets, their rules and the targets they notify are the admin's).
ADMIN_ONLY = {("POST", "/v1/alerts/silences"), ("DELETE", "/v1/alerts/silences/{silence_id}")}
WRONG = [{}, {"Authorization": "Bearer sbt_not-a-token"}, {"Authorization": "Bearer"},
         {"Authorization": "Basic YTpi"}, {"Authorization": f"Bearer {ADMIN_TOKEN}x"}]


def add_checkpoint(settings, job: dict) -> int:
    engine = make_engine(settings.sqlalchemy_url)
    with engine.begin() as conn:
        cid = conn.execute(Checkpoint.__table__.insert().values(
            job_id=job["id"], attempt_id=job["attempts"][0]["id"], step=10, uri="file:///nowhere/step-10",
            bytes=1, keep=False, committed_at=datetime.now(UTC)).returning(Checkpoint.id)).scalar_one()
    engine.dispose()
    return cid


def operations(api) -> list[tuple[str, str]]:
    schema = api.get("/openapi.json").json()
    return [(method.upper(), path) for path, item in schema["paths"].items() if path.startswith("/v1/")
            for method in item]


def test_every_route_refuses_no_token_a_wrong_one_and_another_teams(api, team_headers, settings):
    a, b = team_headers("a"), team_headers("b")
    job_id = api.post("/v1/jobs", json={"run": "echo secret-of-a"}, headers=a).json()["id"]
    job = wait_state(api, a, job_id, TERMINAL)
    checkpoint_id = add_checkpoint(settings, job)
    archive = tgz(**{"secret-of-a.txt": b"a's code"})
    sha256 = hashlib.sha256(archive).hexdigest()
    assert api.put(f"/v1/uploads/{sha256}", content=archive, headers=a).status_code == 201
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    silence = api.post("/v1/alerts/silences", json={"team": "a", "rule": "*", "minutes": 60}, headers=admin)
    assert silence.status_code == 201, silence.text
    ops = operations(api)
    assert len(ops) >= 14 and ("POST", "/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/keep") in ops
    assert ADMIN_ONLY <= set(ops)
    for method, template in ops:
        path = template.format(job_id=job_id, checkpoint_id=checkpoint_id, name="a", sha256=sha256,
                               silence_id=silence.json()["id"])
        body = {"json": {"name": "zz"}} if path == "/v1/teams" else {}
        for headers in WRONG:
            r = api.request(method, path, headers=headers, **body)
            assert r.status_code == 401, (method, path, headers, r.text)
            assert r.headers["content-type"] == "application/problem+json" and r.json()["status"] == 401
        r = api.request(method, path, headers=b, **body)
        if template.startswith("/v1/agent/"):
            assert r.status_code == 401, (method, path)    # a team token is no agent token
        elif template.startswith("/v1/teams") or (method, template) in ADMIN_ONLY:
            assert r.status_code == 403, (method, path)    # admin routes
        elif template == "/v1/uploads/{sha256}":
            assert r.status_code == (404 if method == "GET" else 422), (method, path)  # b has no such upload
        elif "{job_id}" in template:
            assert r.status_code == 404, (method, path, r.text)
            assert str(job_id) not in r.json()["detail"] or "no job" in r.json()["detail"]
        else:
            assert r.status_code in (200, 422), (method, path)  # b's own list, b's own name
            assert "secret-of-a" not in r.text
            assert method != "GET" or path != "/v1/jobs" or r.json()["jobs"] == []
            assert method != "GET" or path != "/v1/alerts/silences" or r.json()["silences"] == []
    # Nothing of a's changed on b's calls.
    assert api.get(f"/v1/jobs/{job_id}", headers=a).json()["state"] == job["state"]
    (kept,) = api.get(f"/v1/jobs/{job_id}/checkpoints", headers=a).json()["checkpoints"]
    assert kept["keep"] is False
    (still,) = api.get("/v1/alerts/silences", headers=a).json()["silences"]
    assert still["id"] == silence.json()["id"] and still["until"] == silence.json()["until"]
    assert api.get(f"/v1/jobs/{job_id}/logs", headers=a).text == "secret-of-a\n"
    assert api.get("/v1/teams", headers=admin).json()[-1]["name"] == "b"


def test_no_token_reaches_a_log_line_or_the_database_in_clear(serve_process, settings):
    with serve_process(log_level="debug") as server, httpx.Client(base_url=server.url, timeout=10) as client:
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        tokens = [ADMIN_TOKEN, "sbt_wrong-token-sent-by-a-client"]
        made = [client.post("/v1/teams", json={"name": "a"}, headers=admin),
                client.post("/v1/teams/a/tokens", headers=admin)]
        tokens += [r.json()["token"] for r in made]
        made.append(client.post("/v1/teams/a/tokens/rotate", headers={"Authorization": f"Bearer {tokens[3]}"}))
        tokens.append(made[-1].json()["token"])
        # an answer holding a token is kept by no cache, a proxy's or a browser's
        assert [r.headers.get("cache-control") for r in made] == ["no-store"] * 3
        h = {"Authorization": f"Bearer {tokens[4]}"}  # (the rotation ended the first two)
        job_id = client.post("/v1/jobs", json={"run": "true"}, headers=h).json()["id"]
        job = wait_state(client, h, job_id, TERMINAL, timeout=60)
        tokens.append(agent_token(b"test-signing-key", job["attempts"][0]["id"]))
        for token in tokens:
            client.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"})
            client.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"})
            client.post("/v1/agent/events", json={"events": []}, headers={"Authorization": f"Bearer {token}"})
    out = server.output()
    assert '"GET /v1/jobs HTTP/1.1" 401' in out and '"GET /v1/jobs HTTP/1.1" 200' in out  # the log is there
    leaked = [t for t in tokens if t in out]
    assert not leaked, f"tokens in the server's log: {leaked}"
    engine = make_engine(settings.sqlalchemy_url)
    meta = MetaData()
    meta.reflect(engine)
    with engine.connect() as conn:
        dump = "\n".join(repr(row) for table in meta.sorted_tables for row in conn.execute(select(table)))
    engine.dispose()
    assert "sbt_" not in dump and not [t for t in tokens if t in dump]
