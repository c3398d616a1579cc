"""`POST /v1/agent/credentials`: fresh storage credentials for an attempt's
node, with its agent token only (an s3:// root is tests/e2e/test_scoped_credentials.py)."""
from __future__ import annotations

from support.helpers import running_job


def test_only_an_agent_token_gets_credentials_and_a_local_root_needs_none(api, team_headers, settings):
    h = team_headers()
    job, token = running_job(api, h, settings)
    assert api.post("/v1/agent/credentials").status_code == 401
    assert api.post("/v1/agent/credentials", headers=h).status_code == 401  # a team token is not an agent's
    r = api.post("/v1/agent/credentials", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
    assert "local directory" in r.json()["detail"]
    assert api.post("/v1/agent/credentials", headers={"Authorization": f"Bearer {token}"}).status_code == 404
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=h)
