"""A local job with a gs:// checkpoint root holds only its own job's
downscoped token, against a local fake of Google's OAuth, STS and Cloud
Storage XML endpoints (tests/support/gcsfake.py: it checks each token exchange and
enforces the token's access boundary on every storage request; it judges
only the boundary conditions the broker writes).

The broker's own credentials are a service account key file (its
application default credentials, refreshed by google-auth's real code at
the fake's OAuth endpoint). The fake is where Cloud Storage is by obstore's
own endpoint setting, `GOOGLE_BASE_URL`, in the broker's environment, as a
user would point the library at a private endpoint; the broker names that
endpoint to the node in its credentials document, and the node's library
uses it, with the downscoped token, for the checkpoint bucket only.

A training run flushes to GCS, is preempted and resumes on the next attempt
from the first attempt's checkpoint; its agent renews the token over its
channel; every storage request the nodes make carries a downscoped token,
never the broker's own."""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from urllib.parse import unquote

import pytest
from support.gcsfake import SOURCE_TOKEN, GoogleFake
from support.helpers import wait_for, wait_state

pytest.importorskip("google.auth", reason="google-auth comes with the broker extra")
pytestmark = [pytest.mark.slow, pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]
REPO = Path(__file__).resolve().parents[2]
# Periodic saves every 5 steps, as the trainer says (the broker's fitted interval would be minutes).
CODE_INTERVAL = {"interval": "code"}
BUCKET = "ckpt"
TRAIN = ["python", str(REPO / "examples" / "train.py"), "--steps", "120", "--seed", "3", "--every-steps", "5",
         "--log-every", "1", "--step-seconds", "0.15"]
# The agent renews 6 s after start, then every 15 s, its floor (the fake's tokens last an hour).
RENEW_EARLY = {"SPOTBROKER_CREDENTIALS_LEAD_SECONDS": "3594"}


@pytest.fixture
def google(tmp_path, monkeypatch):
    fake = GoogleFake().start()
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", fake.adc_file(tmp_path / "adc.json"))
    monkeypatch.setenv("GOOGLE_BASE_URL", fake.url)
    yield fake
    fake.stop()


@pytest.fixture
def settings(settings, google):
    settings.checkpoint_root = f"gs://{BUCKET}/root"
    settings.node_gcs_sts_url = f"{google.url}/v1/token"
    return settings


def attempt_of(boundary: dict) -> str:
    """The attempt prefix an exchanged token may write (its objectAdmin rule)."""
    rule = next(r for r in boundary["accessBoundaryRules"]
                if r["availablePermissions"] == ["inRole:roles/storage.objectAdmin"])
    return rule["availabilityCondition"]["expression"].split("/objects/", 1)[1].rstrip("')")


def test_a_job_flushes_and_resumes_from_gcs_with_only_its_downscoped_token(api, team_headers, settings, google):
    h = team_headers("vision")
    job_id = api.post("/v1/jobs", json={"name": "train", "run": shlex.join(TRAIN), "max_restarts": 0,
                                        "checkpoint": CODE_INTERVAL,
                                        "envs": RENEW_EARLY, "resources": {"accelerators": "T4:1"}},
                      headers=h).json()["id"]
    job = wait_state(api, h, job_id, {"RUNNING"}, timeout=60)
    first_id = job["attempts"][0]["id"]
    first_prefix = f"root/vision/{job_id}/{first_id}/"

    def exchanges_for(prefix: str) -> int:
        return sum(attempt_of(json.loads(unquote(e["options"]))["accessBoundary"]) == prefix
                   for e in google.exchanges)

    wait_for(lambda: "step=12 " in api.get(f"/v1/jobs/{job_id}/logs", headers=h).text, timeout=60,
             what="training to be under way")
    # The launch's token, then the agent's renewal over its channel: a second exchange, the same boundary.
    wait_for(lambda: exchanges_for(first_prefix) >= 2, timeout=30, what="the agent to renew its token")
    assert any(k.startswith(first_prefix) and k.endswith("/MANIFEST.json") for _, k in google.objects)
    assert api.post(f"/v1/jobs/{job_id}/simulate-preemption", headers=h).status_code == 202

    job = wait_state(api, h, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    assert job["state"] == "SUCCEEDED", (job, api.get(f"/v1/jobs/{job_id}/logs", headers=h).text[-3000:])
    first, second = job["attempts"]
    assert first["state"] == "PREEMPTED"
    events = api.get(f"/v1/jobs/{job_id}/events", headers=h).json()["events"]
    resumed = next((e for e in events if e["type"] == "resumed" and e["attempt_id"] == second["id"]), None)
    assert resumed, events
    assert resumed["data"]["step"] > 0 and resumed["data"]["uri"].startswith(f"gs://{BUCKET}/{first_prefix}step-")
    second_prefix = f"root/vision/{job_id}/{second['id']}/"
    assert any(k.startswith(second_prefix) and k.endswith("/MANIFEST.json") for _, k in google.objects)

    # Every storage request the nodes made carried a downscoped token, never the broker's own; each
    # write went under the prefix its token's boundary gives (the fake refused anything else).
    assert google.requests and not any(token == SOURCE_TOKEN for _, _, token in google.requests)
    writes = [(name, token) for method, name, token in google.requests if method in ("PUT", "DELETE")]
    assert writes and all(name.startswith(attempt_of(google.boundaries[token])) for name, token in writes)
    assert {attempt_of(google.boundaries[token]) for _, token in writes} == {first_prefix, second_prefix}
    # The second attempt read the first one's checkpoint with its own token (objectViewer on the job).
    reads = [t for method, name, t in google.requests if method == "GET" and name.startswith(first_prefix)]
    assert any(attempt_of(google.boundaries[t]) == second_prefix for t in reads)
