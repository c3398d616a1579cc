"""A team's storage list over the API: the admin sets the bucket prefixes a
team's jobs may mount; a team reads its own, and mounts what is listed."""
from __future__ import annotations

import pytest
from conftest import ADMIN_TOKEN

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def settings(settings):
    settings.checkpoint_root = "s3://ckpt/root"  # a cloud root: buckets of the same cloud can be mounted
    return settings


def spec(mounts: dict) -> dict:
    return {"run": "true", "file_mounts": mounts, "resources": {"accelerators": "T4:1"}}


def test_the_admin_sets_a_teams_buckets_the_team_reads_them_and_mounts_only_them(api, team_headers):
    a, b = team_headers("a"), team_headers("b")
    body = {"buckets": [{"uri": "s3://my-datasets", "read_only": True}, {"uri": "s3://outputs/a/"}]}
    r = api.put("/v1/teams/a/storage", json=body, headers=ADMIN)
    assert r.status_code == 200, r.text
    want = {"team": "a", "own": "s3://ckpt/root/a/", "buckets": [
        {"uri": "s3://my-datasets/", "read_only": True}, {"uri": "s3://outputs/a/", "read_only": False}]}
    assert r.json() == want
    assert api.get("/v1/teams/a/storage", headers=a).json() == want
    assert api.get("/v1/teams/a/storage", headers=ADMIN).json() == want
    # Only the admin sets it; a team reads its own only.
    assert api.put("/v1/teams/a/storage", json=body, headers=a).status_code == 403
    assert api.get("/v1/teams/a/storage", headers=b).status_code == 403
    assert api.get("/v1/teams/b/storage", headers=b).json()["buckets"] == []
    assert api.put("/v1/teams/nobody/storage", json=body, headers=ADMIN).status_code == 404

    ok = api.post("/v1/jobs", json=spec({"/data": {"source": "s3://my-datasets/imagenet", "mode": "COPY"},
                                         "/out": "s3://outputs/a/run-1", "/ckpt": {"name": "my-ckpts"}}),
                  headers=a)
    assert ok.status_code == 201, ok.text
    assert ok.json()["spec"]["file_mounts"]["/ckpt"] == {"name": "my-ckpts", "mode": "MOUNT"}
    r = api.post("/v1/jobs", json=spec({"/data": "s3://my-datasets/x"}), headers=b)  # a's list is not b's
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "file_mounts./data"
    message = r.json()["errors"][0]["message"]
    assert "s3://ckpt/root/b/" in message and "teams storage" in message, message
    r = api.post("/v1/jobs", json=spec({"/x": {"source": "s3://outputs/b/x"}}), headers=a)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "file_mounts./x.source"
    assert "s3://my-datasets/ (read only), s3://outputs/a/" in r.json()["errors"][0]["message"]
    r = api.post("/v1/jobs", json=spec({"/x": {"source": "gs://my-datasets/x"}}), headers=a)
    assert r.status_code == 422 and "s3:// storage only" in r.json()["errors"][0]["message"]

    # The whole list is replaced: an empty one allows nothing more.
    assert api.put("/v1/teams/a/storage", json={"buckets": []}, headers=ADMIN).json()["buckets"] == []
    r = api.post("/v1/jobs", json=spec({"/data": "s3://my-datasets/imagenet"}), headers=a)
    assert r.status_code == 422


@pytest.mark.parametrize("bucket, field", [
    ({"uri": "s3://ckpt/root/b/"}, "buckets.0.uri"),     # another team's checkpoints
    ({"uri": "s3://ckpt"}, "buckets.0.uri"),             # the whole root's bucket
    ({"uri": "s3://data/../ckpt"}, "buckets.0.uri"),
    ({"uri": "s3://data/*"}, "buckets.0.uri"),
    ({"uri": "s3://data/a\x00b"}, "buckets.0.uri"),        # a NUL, a newline: no key has them, and
    ({"uri": "s3://data/a\nfake-line"}, "buckets.0.uri"),  # a listing or a log line would be forged
    ({"uri": "/etc"}, "buckets.0.uri"),
    ({"uri": "s3://data", "read_only": "maybe"}, "buckets.0.read_only"),
    ({"uri": "s3://data", "write": True}, "buckets.0.write"),
    # another cloud than the root's: its nodes get no credentials there (was refused only at a job's submission)
    ({"uri": "gs://data"}, "buckets.0.uri"),
])
def test_a_bad_entry_is_a_422_naming_it_and_changes_nothing(api, team_headers, bucket, field):
    team_headers("a")
    api.put("/v1/teams/a/storage", json={"buckets": [{"uri": "s3://kept"}]}, headers=ADMIN)
    r = api.put("/v1/teams/a/storage", json={"buckets": [bucket]}, headers=ADMIN)
    assert r.status_code == 422, r.text
    assert field in [e["field"] for e in r.json()["errors"]], r.json()
    assert api.get("/v1/teams/a/storage", headers=ADMIN).json()["buckets"] == [{"uri": "s3://kept/",
                                                                                "read_only": False}]


def test_a_bucket_by_name_is_checked_as_a_bucket_name(api, team_headers):
    a = team_headers("a")
    for name in ("UPPER", "a", "../x", "x/y"):
        r = api.post("/v1/jobs", json=spec({"/ckpt": {"name": name}}), headers=a)
        assert r.status_code == 422, (name, r.text)
        assert any(e["field"].startswith("file_mounts./ckpt") for e in r.json()["errors"]), r.json()
    r = api.post("/v1/jobs", json=spec({"/ckpt": {"name": "x-1", "source": "s3://ckpt/root/a/y"}}), headers=a)
    assert r.status_code == 422
    # A store other than the broker's: the bucket lives in the team's storage all the same, and the answer says so.
    r = api.post("/v1/jobs", json=spec({"/ckpt": {"name": "x-1", "store": "gcs"}}), headers=a)
    assert r.status_code == 201, r.text
    assert [w["field"] for w in r.json()["warnings"]] == ["file_mounts./ckpt.store"], r.json()


def test_the_cli_sets_and_shows_a_teams_storage(api, team_headers, settings):
    import os
    import subprocess
    import sys

    a = team_headers("a")

    def cli(token: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
        env.update(SPOTBROKER_URL=f"http://127.0.0.1:{settings.port}", SPOTBROKER_TOKEN=token)
        return subprocess.run([sys.executable, "-m", "spotbroker.broker.cli", "teams", "storage", *args], env=env,
                              capture_output=True, text=True, timeout=60)

    done = cli(ADMIN_TOKEN, "a", "--bucket", "s3://outputs/a", "--read-only", "s3://my-datasets")
    assert done.returncode == 0, done.stderr
    assert "s3://outputs/a/  read and write" in done.stdout and "s3://my-datasets/  read only" in done.stdout
    shown = cli(a["Authorization"].split()[1], "a")
    assert shown.returncode == 0 and shown.stdout == done.stdout
    refused = cli(a["Authorization"].split()[1], "a", "--clear")
    assert refused.returncode == 1 and "admin token" in refused.stderr and "Traceback" not in refused.stderr
    bad = cli(ADMIN_TOKEN, "a", "--bucket", "s3://ckpt/root")
    assert bad.returncode == 1 and "buckets.0.uri" in bad.stderr and "checkpoint root" in bad.stderr, bad.stderr


@pytest.mark.parametrize("remote", ["~/.", "/.", "~/a/./b", "/a//b", "~/..", "/x/.."])
def test_a_mount_path_that_is_no_path_of_its_own_is_refused(api, team_headers, remote):
    """`~/.` is the home itself, which a node would replace with the mount."""
    r = api.post("/v1/jobs", json=spec({remote: {"name": "ckpt"}}), headers=team_headers("a"))
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "file_mounts", r.text
