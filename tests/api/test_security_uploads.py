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


def test_two_uploads_racing_on_two_brokers_cannot_both_pass_the_quota(settings, monkeypatch):
    """Two brokers on one database; each upload alone fits the team's quota,
    both do not. However their checks and stores interleave (here: each
    store waits until the other upload reaches its store too, or 3 s), one
    is stored and the other refused."""
    import threading

    from conftest import ADMIN_TOKEN, served

    from spotbroker.agent.checkpoint.storage import Storage

    first, second = tgz(**{"a.txt": b"a" * 100}), tgz(**{"b.txt": b"b" * 100})
    settings.upload_quota_bytes = len(first) + len(second) - 1
    both_storing = threading.Barrier(2, timeout=3)
    put_file = Storage.put_file

    def put_when_both_are_here(self, key, path):
        try:
            both_storing.wait()
        except threading.BrokenBarrierError:
            pass  # the other upload never came this far
        put_file(self, key, path)

    monkeypatch.setattr(Storage, "put_file", put_when_both_are_here)
    other = settings.model_copy()
    with served(settings) as one, served(other) as two:
        token = one.post("/v1/teams", json={"name": "ml"},
                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()["token"]
        h = {"Authorization": f"Bearer {token}"}
        answers = {}

        def upload(api, name, body):
            answers[name] = put(api, h, body).status_code

        threads = [threading.Thread(target=upload, args=(one, "first", first)),
                   threading.Thread(target=upload, args=(two, "second", second))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert sorted(answers.values()) == [201, 413], answers
    stored = Path(settings.data_dir) / "checkpoints" / "ml" / "uploads"
    assert sum(p.stat().st_size for p in stored.iterdir()) <= settings.upload_quota_bytes


def test_a_teams_uploads_are_the_brokers_alone_from_the_first_one(api, team_headers, settings, monkeypatch):
    """On a local disk the team's directory is entered, not listed (its job
    prefixes are each job's own), and its uploads directory is the broker's:
    so already when the first archive is written there. The team's directory
    was once left listable, and the first archive readable while it was stored."""
    from spotbroker.broker.jobs import uploads

    team_dir = Path(settings.data_dir) / "checkpoints" / "ml"
    modes = []
    put_file = uploads.Storage.put_file

    def mode(path: Path) -> int | None:
        return path.stat().st_mode & 0o777 if path.exists() else None

    def watched(self, key, path):
        modes.append((mode(team_dir), mode(team_dir / "uploads")))
        return put_file(self, key, path)

    monkeypatch.setattr(uploads.Storage, "put_file", watched)
    assert put(api, team_headers("ml"), tgz(**{"a.txt": b"a"})).status_code == 201
    assert modes == [(0o711, 0o700)]
    assert (mode(team_dir), mode(team_dir / "uploads")) == (0o711, 0o700)
