"""Uploads over REST: content-addressed, authenticated, bounded, stored by the
broker under the team's own prefix; and the job spec's `workdir` that names one."""
from __future__ import annotations

import hashlib
import io
import os
import tarfile
import time
from pathlib import Path

import httpx
import pytest
from support.helpers import tgz, wait_for

ADMIN = {"Authorization": "Bearer admin-token-for-tests"}


def put(api, h, body: bytes, sha: str | None = None):
    sha = sha or hashlib.sha256(body).hexdigest()
    return api.put(f"/v1/uploads/{sha}", content=body, headers={**h, "Content-Type": "application/gzip"})


def test_an_upload_is_stored_under_the_teams_prefix_by_its_hash(api, team_headers, settings):
    h, other = team_headers("ml"), team_headers("other")
    body = tgz(**{"train.py": b"print(1)\n"})
    sha = hashlib.sha256(body).hexdigest()
    assert api.get(f"/v1/uploads/{sha}", headers=h).status_code == 404
    r = put(api, h, body)
    assert r.status_code == 201 and r.json() == {"sha256": sha, "bytes": len(body)}
    stored = Path(settings.data_dir) / "checkpoints" / "ml" / "uploads" / f"{sha}.tar.gz"
    assert stored.read_bytes() == body
    assert stored.parent.stat().st_mode & 0o077 == 0  # the broker's alone: local jobs share one user
    assert api.get(f"/v1/uploads/{sha}", headers=h).json() == {"sha256": sha, "bytes": len(body)}
    assert put(api, h, body).status_code == 201  # idempotent
    assert api.get(f"/v1/uploads/{sha}", headers=other).status_code == 404  # a team sees only its own
    assert api.put(f"/v1/uploads/{sha}", content=body).status_code == 401
    assert api.get(f"/v1/uploads/{sha}", headers=ADMIN).status_code == 403


def test_an_upload_may_be_larger_than_a_job_document(api, team_headers):
    """Every other route takes at most 1 MiB: an upload is bounded by its own archive limit."""
    body = tgz(**{"weights.bin": os.urandom(3 << 20)})
    r = put(api, team_headers(), body)
    assert r.status_code == 201 and r.json()["bytes"] == len(body) > 3 << 20


def test_bad_uploads_are_refused_naming_what_is_wrong(api, team_headers, settings, monkeypatch):
    h = team_headers()
    body = tgz(**{"a.py": b"x"})
    r = put(api, h, body, sha="0" * 64)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "sha256"
    r = put(api, h, body, sha="NOT-A-HASH")
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "sha256"
    r = put(api, h, b"plain text, not an archive")
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body"
    assert "not a gzipped tar" in r.json()["errors"][0]["message"]
    r = put(api, h, tgz(**{"../../escape.py": b"x"}))
    assert r.status_code == 422 and "outside the working directory" in r.json()["errors"][0]["message"]
    monkeypatch.setattr("spotbroker.api.routers.uploads.MAX_ARCHIVE_BYTES", 64)
    r = put(api, h, body + b"\0" * 100)
    assert r.status_code == 413 and r.headers["content-type"] == "application/problem+json"
    chunked = api.put(f"/v1/uploads/{'a' * 64}", content=iter([body, b"\0" * 100]), headers=h)  # no length said
    assert chunked.status_code == 413
    uploads = Path(settings.data_dir) / "checkpoints" / "ml" / "uploads"
    assert not uploads.exists() or not list(uploads.iterdir())  # nothing refused was kept


@pytest.mark.parametrize("workdir, field, says", [
    (".", "workdir", "path on the broker's host"),
    ("/etc", "workdir", "path on the broker's host"),
    ({"upload": "f" * 64}, "workdir.upload", "no upload"),
    ({"upload": "short"}, "workdir", "pattern"),
])
def test_a_workdir_must_name_one_of_the_teams_uploads(api, team_headers, workdir, field, says):
    h = team_headers()
    r = api.post("/v1/jobs", json={"run": "ls", "workdir": workdir}, headers=h)
    assert r.status_code == 422, r.text
    assert any(e["field"].startswith(field) and says in e["message"] for e in r.json()["errors"]), r.json()


def test_a_job_runs_in_its_upload_and_another_teams_cannot(api, team_headers):
    from support.helpers import wait_state

    h, other = team_headers("ml"), team_headers("other")
    body = tgz(**{"hello.txt": b"hello from the upload\n"})
    sha = hashlib.sha256(body).hexdigest()
    assert put(api, h, body).status_code == 201
    r = api.post("/v1/jobs", json={"run": "cat hello.txt; pwd", "workdir": {"upload": sha}}, headers=other)
    assert r.status_code == 422  # the hash alone is no key to another team's code
    r = api.post("/v1/jobs", json={"run": "cat hello.txt", "workdir": {"upload": sha}}, headers=h)
    assert r.status_code == 201, r.text
    job = wait_state(api, h, r.json()["id"], {"SUCCEEDED", "FAILED"}, timeout=60)
    assert job["state"] == "SUCCEEDED", job
    assert api.get(f"/v1/jobs/{job['id']}/logs", headers=h).text == "hello from the upload\n"


def test_the_upload_is_documented(api):
    schema = api.get("/openapi.json").json()
    put_op = schema["paths"]["/v1/uploads/{sha256}"]["put"]
    assert "application/gzip" in put_op["requestBody"]["content"]
    workdir = schema["components"]["schemas"]["JobSpec"]["properties"]["workdir"]
    assert "WorkdirUpload" in str(workdir)


def test_a_client_that_goes_mid_upload_leaves_no_traceback(server):
    """A client may give up half-way (a network drop, a ^C): not an error of ours."""
    import socket
    from urllib.parse import urlparse

    with httpx.Client(base_url=server.url, timeout=10) as client:
        token = client.post("/v1/teams", json={"name": "gone"},
                            headers=ADMIN).json()["token"]
        url = urlparse(server.url)
        with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
            sock.sendall((f"PUT /v1/uploads/{'a' * 64} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                          "Content-Type: application/gzip\r\nContent-Length: 10000\r\n\r\n").encode() + b"x" * 166)
            time.sleep(0.5)
        wait_for(lambda: client.get("/healthz").status_code == 200, what="the server to answer")
        time.sleep(0.5)
    out = server.output()
    assert "Traceback" not in out and "ClientDisconnect" not in out, out[-3000:]


def test_links_that_lead_out_only_through_one_another_are_refused_at_upload(api, team_headers):
    """Each link stays inside on its own (d -> ., d/e -> .., d/e/f -> ..), but
    d/e/f resolves above the tree: refused now, not when a node unpacks it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, target in (("d", "."), ("d/e", ".."), ("d/e/f", "..")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    r = put(api, team_headers(), buf.getvalue())
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body", r.text
