"""A SkyPilot task file over the API: SkyPilot's messages in the 422 with the
field and line, what the broker cannot honour refused by name, secrets shown
by name only, SkyPilot's on-demand default kept; and the catalog files the
broker gives SkyPilot."""
from __future__ import annotations

import hashlib
import os

import pytest

from spotbroker.broker.jobs.mounts import mount_errors
from spotbroker.broker.jobs.spec import JobSpec
from spotbroker.broker.launch.skypilot import catalogs
from spotbroker.broker.settings import Settings

pytest.importorskip("sky", reason="SkyPilot (the broker extra) is not installed")
YAML = {"Content-Type": "application/yaml"}


def post(api, headers, body: bytes):
    return api.post("/v1/jobs", content=body, headers={**headers, **YAML})


def test_skypilots_own_message_names_the_field_and_line(api, team_headers):
    r = post(api, team_headers(), b"name: t\nrun: x\nresources:\n  use_spot: true\n  acceleratorz: A100:1\n")
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["field"] == "resources.acceleratorz" and err["line"] == 5
    assert "Instead of 'acceleratorz', did you mean 'accelerators'?" in err["message"]


@pytest.mark.parametrize("body, field", [
    (b"run: x\nresources: {job_recovery: FAILOVER}\n", "resources.job_recovery"),
    (b"run: x\nsecrets: {HF_TOKEN: null}\n", "secrets.HF_TOKEN"),
    (b"run: x\nsecrets: {HF_TOKEN: [a, b]}\n", "secrets.HF_TOKEN"),     # a list: its repr would be the value
    (b"run: x\nsecrets: {HF_TOKEN: {k: v}}\n", "secrets.HF_TOKEN"),
    (b"run: x\nenvs: {MODE: [fast]}\n", "envs.MODE"),
    (b"run: x\nfile_mounts: {/data: /etc}\n", "file_mounts./data"),
])
def test_what_the_broker_cannot_honour_is_refused_by_name(api, team_headers, body, field):
    r = post(api, team_headers(), body)
    assert r.status_code == 422, r.text
    assert field in [e["field"] for e in r.json()["errors"]], r.json()


def test_secrets_are_shown_by_name_only(api, team_headers, caplog):
    h = team_headers()
    r = post(api, h, b"run: x\nsecrets: {HF_TOKEN: hf-s3cr3t-value}\nenvs: {A: 1}\n")
    assert r.status_code == 201, r.text
    job = api.get(f"/v1/jobs/{r.json()['id']}", headers=h)
    assert job.json()["spec"]["secrets"] == ["HF_TOKEN"] and job.json()["spec"]["envs"] == {"A": "1"}
    assert "hf-s3cr3t-value" not in job.text + r.text + caplog.text
    api.post(f"/v1/jobs/{r.json()['id']}/cancel", headers=h)


@pytest.mark.parametrize("infra, stored", [
    ("k8s", "k8s"), ("k8s/lab-a", "k8s/lab-a"), ("kubernetes/arn:aws:eks:us-east-1:1:cluster/gpu",
                                                 "kubernetes/arn:aws:eks:us-east-1:1:cluster/gpu")])
def test_a_file_for_the_kubernetes_places_is_taken_as_written(api, team_headers, infra, stored):
    """SkyPilot's `infra: k8s[/CONTEXT]` means the broker's Kubernetes places
    (that context): stored as written; what a cluster cannot run fails at
    placement, as an unknown region does."""
    h = team_headers()
    r = post(api, h, f"run: x\nresources: {{infra: '{infra}', accelerators: H100:8}}\n".encode())
    assert r.status_code == 201, r.text
    spec = api.get(f"/v1/jobs/{r.json()['id']}", headers=h).json()["spec"]
    assert spec["resources"]["infra"] == stored and spec["resources"]["use_spot"] is False
    api.post(f"/v1/jobs/{r.json()['id']}/cancel", headers=h)


def test_a_file_without_use_spot_runs_on_demand(api, team_headers):
    h = team_headers()
    r = post(api, h, b"run: x\nresources:\n  any_of:\n    - {accelerators: A10G:1}\n"
                     b"    - {accelerators: L4:1, use_spot: true}\n")
    assert r.status_code == 201, r.text
    alts = JobSpec.model_validate(r.json()["spec"]).resources.alternatives()
    assert [a.use_spot for a in alts] == [False, True]
    api.post(f"/v1/jobs/{r.json()['id']}/cancel", headers=h)


def test_a_stored_spec_keeps_its_meaning():
    # as the broker stored a task file without use_spot before (spot), read back today
    old = {"name": "job", "run": "x", "resources": {"use_spot": True, "any_of": [
        {"accelerators": "A10G:1", "use_spot": True}, {"accelerators": "L4:1", "use_spot": True}]}}
    assert all(a.use_spot for a in JobSpec.model_validate(old).resources.alternatives())


def test_mounts_must_lie_under_the_teams_prefix(tmp_path):
    settings = Settings(data_dir=tmp_path, checkpoint_root="s3://bucket/root")
    spec = JobSpec.model_validate({"run": "x", "file_mounts": {
        "/mine": "s3://bucket/root/alice/data", "/theirs": "s3://bucket/root/bob/data",
        "/other": {"source": "s3://elsewhere/x", "mode": "COPY"}}})
    fields = [e["field"] for e in mount_errors(settings, "alice", spec, [])]
    assert fields == ["file_mounts./theirs", "file_mounts./other.source"]


def test_catalogs_are_placed_as_skypilots_own_and_left_alone_once_replaced(tmp_path, monkeypatch):
    placed = catalogs.place_missing(tmp_path)
    assert set(placed) == set(catalogs.BUNDLED)
    data = (tmp_path / "aws/vms.csv").read_bytes()
    # SkyPilot counts it as fetched (its md5 in .meta), so refetches it after its interval
    assert (tmp_path / ".meta/aws/vms.csv.md5").read_text() == hashlib.md5(data).hexdigest()
    assert catalogs.place_missing(tmp_path) == [] and catalogs.still_placed(tmp_path, "aws/vms.csv")
    gcp = (tmp_path / "gcp/vms.csv").read_text()
    assert gcp.count("InstanceType,") == 1 and "\nn1-highmem-8,8.0,52.0," in gcp  # the N1 hosts of T4, V100...
    # a file an older broker placed (its rows since changed) is placed again; one replaced by hand is not
    (tmp_path / "gcp/vms.csv").write_text(gcp.split("\nn1-")[0] + "\n")
    catalogs._write(tmp_path / ".spotbroker/gcp/vms.csv.md5",
                    hashlib.md5((tmp_path / "gcp/vms.csv").read_bytes()).hexdigest().encode())
    assert catalogs.place_missing(tmp_path) == ["gcp/vms.csv"] and (tmp_path / "gcp/vms.csv").read_text() == gcp
    (tmp_path / "gcp/vms.csv").write_text("replaced by hand\n")
    assert not catalogs.still_placed(tmp_path, "gcp/vms.csv") and catalogs.place_missing(tmp_path) == []

    import requests

    def offline(*args, **kwargs):
        assert kwargs["timeout"] == catalogs.DOWNLOAD_TIMEOUT
        raise requests.ConnectionError("offline")

    monkeypatch.setattr(requests, "get", offline)
    assert catalogs.refresh_placed(tmp_path) == [] and (tmp_path / "aws/vms.csv").read_bytes() == data


def test_skypilots_catalog_downloads_are_bounded(monkeypatch):
    import requests
    from sky.catalog import common

    catalogs.bound_downloads()
    seen = {}
    monkeypatch.setattr(requests, "get", lambda *a, **kw: seen.update(kw) or (_ for _ in ()).throw(
        requests.ConnectionError("offline")))
    with pytest.raises(requests.ConnectionError):
        common.requests.get("https://example.invalid/x.csv")
    assert seen["timeout"] == catalogs.DOWNLOAD_TIMEOUT


def test_importing_the_cli_does_not_import_skypilot():
    import subprocess
    import sys

    code = "import sys, spotbroker.broker.cli, spotbroker.agent; print('sky' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ}, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("body, field, says, line", [
    # a pipeline or a job group: one task per file (was: "but found another document")
    (b"name: p\n---\nname: a\nrun: x\n---\nname: b\nrun: y\n", "body", "one task per file", 3),
    # SkyPilot's git workdir (was: pydantic's "workdir.upload: Field required", "url: Extra inputs ...")
    (b"run: x\nworkdir:\n  url: https://github.com/org/repo.git\n  ref: main\n", "workdir", "git clone", 2),
    # a task of setup only, which SkyPilot takes (was: pydantic's "Field required")
    (b"setup: |\n  echo only-setup\n", "run", "give the command in `run`", None),
    # a typo inside `config` (the operator's): told as `config`
    (b"run: x\nconfig:\n  kubernetes:\n    pod_confg: {}\n", "config", "operator", 2),
    # an env left empty names the bucket (was: a bare regex)
    (b"envs: {B: ''}\nrun: x\nfile_mounts:\n  /d:\n    name: ${B}\n", "file_mounts./d.name", "bucket name ''", 5),
    # (was: three errors naming UploadMount and StorageMount)
    (b"run: x\nfile_mounts:\n  /data:\n", "file_mounts./data", "a valid dictionary, or a valid string", 3),
])
def test_a_task_file_the_broker_cannot_take_is_told_in_one_plain_message(api, team_headers, body, field, says, line):
    r = post(api, team_headers(), body)
    assert r.status_code == 422, r.text
    (err,) = r.json()["errors"]
    assert (err["field"], err.get("line")) == (field, line) and says in err["message"], err
    assert "Mount" not in err["message"] and "pattern" not in err["message"], err


def test_an_empty_document_before_or_after_the_task_is_passed_over_as_skypilot_does(api, team_headers):
    h = team_headers()
    task = b"run: 'true'\nresources: {use_spot: true}\n"
    for body in (task + b"---\n", b"---\n" + task):
        r = post(api, h, body)
        assert r.status_code == 201, r.text
        api.post(f"/v1/jobs/{r.json()['id']}/cancel", headers=h)


def test_a_set_of_accelerators_passes_over_those_no_cloud_sells(api, team_headers):
    """`{L4, A40}` (llm/gemma/serve.yaml's kind) was refused whole for A40: SkyPilot runs it on L4."""
    h = team_headers()
    r = post(api, h, b"run: 'true'\nresources:\n  accelerators: {L4: 1, A40: 1}\n  use_spot: true\n")
    assert r.status_code == 201, r.text
    (warning,) = [w for w in r.json()["warnings"] if "A40" in w["message"]]
    assert warning["field"] == "resources.any_of.1.accelerators" and "passed over" in warning["message"]
    api.post(f"/v1/jobs/{r.json()['id']}/cancel", headers=h)
    r = post(api, h, b"run: 'true'\nresources:\n  accelerators: {L40: 1, A40: 1}\n")
    assert r.status_code == 422 and {e["field"] for e in r.json()["errors"]} == {
        "resources.any_of.0.accelerators", "resources.any_of.1.accelerators"}, r.text


def test_a_service_section_is_dropped_with_a_warning_as_sky_launch_drops_it(api, team_headers):
    """A serving recipe (llm/llama-3_1) says `sky launch` in its own usage:
    SkyPilot runs it, ignoring `service` with a warning; it was refused."""
    body = b"service:\n  readiness_probe: /v1/models\n  replicas: 2\nrun: vllm serve model\n"
    r = post(api, team_headers(), body)
    assert r.status_code == 201, r.text
    [warned] = [w for w in r.json()["warnings"] if w["field"] == "service"]
    assert warned["line"] == 1 and "sky serve up" in warned["message"] and "ignored" in warned["message"]
    assert "service" not in r.json()["spec"]
