"""A team cannot fill the broker's storage with uploads: each team keeps at
most `upload_quota_bytes` of them, and one over it is refused with a 413
that says the quota, storing nothing."""
from __future__ import annotations

import hashlib
from pathlib import Path

from support.helpers import tgz


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


def _bomb() -> bytes:
    """A small archive of one large file of zeros (about 250 KB for 250 MiB)."""
    import gzip
    import io
    import tarfile

    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9) as gz, tarfile.open(fileobj=gz, mode="w|") as tar:
        info = tarfile.TarInfo("zeros")
        info.size = 250 * 1024 * 1024

        class Zeros(io.RawIOBase):
            left = info.size

            def readinto(self, b):
                n = min(len(b), self.left)
                b[:n] = bytes(n)
                self.left -= n
                return n

        tar.addfile(info, Zeros())
    return raw.getvalue()


def test_a_team_over_its_quota_is_refused_before_its_upload_is_read(api, team_headers, settings, monkeypatch):
    """A team already over its quota made the broker unpack each upload to
    its /tmp first (a 255 KB archive cost 250 MiB of disk and 2.2 s): the
    quota is checked on the declared size before a byte is read, and on the
    archive's own size before it is looked into."""
    import socket

    from spotbroker.broker.jobs import uploads

    h = team_headers("ml")
    first = tgz(**{"a.txt": b"a" * 100})
    settings.upload_quota_bytes = len(first) + 1000
    assert put(api, h, first).status_code == 201
    bomb = _bomb()
    sha = hashlib.sha256(bomb).hexdigest()

    def looked_into(*args, **kwargs):
        raise AssertionError("an upload over the quota was looked into")

    monkeypatch.setattr(uploads, "check_archive", looked_into)
    # Declared, and not sent: the answer comes all the same.
    with socket.create_connection(("127.0.0.1", settings.port), timeout=10) as conn:
        conn.sendall((f"PUT /v1/uploads/{sha} HTTP/1.1\r\nHost: x\r\n{next(iter(h))}: {h['Authorization']}\r\n"
                      f"Content-Type: application/gzip\r\nContent-Length: {len(bomb)}\r\n\r\n").encode())
        head = conn.recv(65536).decode(errors="replace")
    assert head.startswith("HTTP/1.1 413") and "quota" in head, head[:500]
    # Not declared (chunked): read, hashed, and refused before it is looked into.
    r = api.put(f"/v1/uploads/{sha}", content=iter([bomb[:100_000], bomb[100_000:]]),
                headers={**h, "Content-Type": "application/gzip"})
    assert r.status_code == 413 and "quota" in r.json()["detail"], r.text
    stored = Path(settings.data_dir) / "checkpoints" / "ml" / "uploads"
    assert len(list(stored.iterdir())) == 1


def test_an_upload_is_checked_without_being_unpacked(api, team_headers, monkeypatch):
    """99,990 empty files took 20 s per upload to unpack and delete; the
    check now reads the archive as a stream and follows its links by name."""
    import tarfile

    def unpacked(*args, **kwargs):
        raise AssertionError("the upload was unpacked to be checked")

    monkeypatch.setattr(tarfile.TarFile, "extractall", unpacked)
    h = team_headers("ml")
    many = tgz(**{f"d/f{i}": b"" for i in range(2000)})
    assert put(api, h, many).status_code == 201


def test_a_streamed_upload_over_the_quota_is_stopped_where_it_passes_it(api, team_headers, settings, monkeypatch):
    """No Content-Length (a chunked body): the quota is still checked before
    the body is read, and the body is not read past it. A team over its
    quota once had 50 MB of a chunked body written to the broker's /tmp
    before the 413."""
    import tempfile

    h = team_headers("ml")
    first = tgz(**{"a.txt": b"a" * 100})
    settings.upload_quota_bytes = len(first) + 1000
    assert put(api, h, first).status_code == 201
    written = []
    mkstemp = tempfile.mkstemp

    def watched(*args, **kwargs):
        fd, name = mkstemp(*args, **kwargs)
        written.append(Path(name))
        return fd, name

    monkeypatch.setattr("spotbroker.api.routers.uploads.tempfile.mkstemp", watched)
    from spotbroker.api.routers import uploads as route

    taken, read_body = [], route._body

    async def counted(request):
        async for chunk in read_body(request):
            taken.append(len(chunk))
            yield chunk

    monkeypatch.setattr(route, "_body", counted)
    r = api.put(f"/v1/uploads/{'b' * 64}", content=(b"\0" * 65536 for _ in range(800)),  # 50 MB
                headers={**h, "Content-Type": "application/gzip"})
    assert r.status_code == 413 and "quota" in r.json()["detail"], r.text
    assert written and all(not p.exists() for p in written)  # the partial body is gone
    assert sum(taken) < 1 << 20, sum(taken)                     # and no more of it was taken than passed the quota
    settings.upload_quota_bytes = len(first)                    # a team at its quota: refused at once
    r = api.put(f"/v1/uploads/{'c' * 64}", content=iter([b"\0" * 10]), headers=h)
    assert r.status_code == 413, r.text


def test_an_upload_whose_body_stops_coming_is_given_up(api, team_headers, monkeypatch):
    import threading

    monkeypatch.setattr("spotbroker.api.routers.uploads.BODY_IDLE_S", 1.0)
    stalled = threading.Event()

    def body():
        yield b"\0" * 1000
        # The client holds the connection and sends nothing more: five times the idle bound
        # (it held 30 s, all of it this test's wall time: the client sends until the body ends).
        stalled.wait(5)
        yield b"\0"

    try:
        r = api.put(f"/v1/uploads/{'d' * 64}", content=body(), headers=team_headers("ml"), timeout=30)
    finally:
        stalled.set()
    assert r.status_code == 408 and "1 s" in r.json()["detail"], r.text


def test_an_archive_the_team_already_has_is_not_checked_again(api, team_headers, monkeypatch):
    """Re-sending one archive of 99,000 empty files (5.3 s of check, two checks at
    once for every team) held the check slots: another team's 2 KB upload waited 9-19 s."""
    from spotbroker.broker.jobs import uploads

    checked = []
    real = uploads.store
    monkeypatch.setattr(uploads, "store", lambda *a, **kw: checked.append(a[4]) or real(*a, **kw))
    h = team_headers("ml")
    archive = tgz(**{f"d/f{i}": b"" for i in range(200)})
    assert [put(api, h, archive).status_code for _ in range(3)] == [201, 201, 201]
    assert checked == [hashlib.sha256(archive).hexdigest()]  # the same bytes (their hash): checked once
    other = team_headers("other")
    assert put(api, other, archive).status_code == 201 and len(checked) == 2  # another team's: its own check


def test_a_team_checks_one_archive_at_a_time_so_another_teams_is_not_kept_waiting(api, team_headers, monkeypatch):
    """One team's big archives took both check places from every other team:
    a team's checks now wait for each other, not for the places."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from support.teamgate import OtherTeamFirst

    from spotbroker.broker.jobs import uploads

    ml, cv = team_headers("ml"), team_headers("cv")
    gate = OtherTeamFirst(uploads.store, lambda settings, factory, team_id, team_name, *rest, **kw: team_name)
    monkeypatch.setattr(uploads, "store", gate)
    with ThreadPoolExecutor(4) as pool:
        mls = [pool.submit(put, api, ml, tgz(**{f"m{i}.txt": b"m" * 10})) for i in range(3)]
        time.sleep(0.5)  # ml's archives are in first
        assert put(api, cv, tgz(**{"c.txt": b"c"})).status_code == 201
        assert [f.result().status_code for f in mls] == [201] * 3
    assert not gate.stalled, "another team's archive waited behind this team's"
    assert gate.peak == {"ml": 1, "cv": 1}
