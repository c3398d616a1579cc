"""A team cannot fill the broker's storage with uploads: each team keeps at
most `upload_quota_bytes` of them, and one over it is refused with a 413
that says the quota, storing nothing."""
from __future__ import annotations

import hashlib
from pathlib import Path

from helpers import tgz


def put(api, h, body: bytes):
    sha = hashlib.sha256(body).hexdigest()
    return api.put(f"/v1/uploads/{sha}", content=body, headers={**h, "Content-Type": "application/gzip"})


def test_uploads_over_the_teams_quota_are_refused_and_not_stored(api, team_headers, settings):
    h, other = team_headers("ml"), team_headers("other")
    first, second = tgz(**{"a.txt": b"a" * 100}), tgz(**{"b.txt": b"b" * 100})
    settings.upload_quota_bytes = len(first) + len(second) - 1
    assert put(api, h, first).status_code == 201
    assert put(api, h, first).status_code == 201  # one the team has already costs nothing
    r = put(api, h, second)
    assert r.status_code == 413, r.text
    assert "quota" in r.json()["detail"] and str(settings.upload_quota_bytes) in r.json()["detail"]
    stored = Path(settings.data_dir) / "checkpoints" / "ml" / "uploads"
    assert sorted(p.name for p in stored.iterdir()) == [f"{hashlib.sha256(first).hexdigest()}.tar.gz"]
    assert put(api, other, second).status_code == 201  # the quota is each team's own


def test_no_quota_when_the_setting_is_0(api, team_headers, settings):
    settings.upload_quota_bytes = 0
    h = team_headers("ml")
    assert put(api, h, tgz(**{"a.txt": b"a"})).status_code == 201
