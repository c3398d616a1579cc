"""A local job with an az:// checkpoint root holds only its own job's SAS
tokens, against tests/support/azurefake.py (a Blob endpoint of an account with
hierarchical namespace that checks every SAS's signature with the account's
key and derives a directory SAS's directory from ``sdd``, as Azure does; its
doc says what it does not judge). The broker has the account's key in its
environment (obstore's variables); the node never does.

A training run flushes to its attempt's directory, is preempted and resumes
on the next attempt from the first attempt's checkpoint (read with the
second attempt's token for the job's directory); its agent renews the tokens
over its channel."""
from __future__ import annotations

import shlex
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from support.azurefake import AzureFake
from support.helpers import wait_for, wait_state

pytest.importorskip("azure.storage.blob", reason="azure-storage-blob comes with the broker extra")
pytestmark = [pytest.mark.slow, pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]
REPO = Path(__file__).resolve().parents[2]
# Periodic saves every 5 steps, as the trainer says (the broker's fitted interval would be minutes).
CODE_INTERVAL = {"interval": "code"}
CONTAINER = "ckpt"
TRAIN = ["python", str(REPO / "examples" / "train.py"), "--steps", "120", "--seed", "3", "--every-steps", "5",
         "--log-every", "1", "--step-seconds", "0.15"]
# Tokens last 900 s here: the agent renews 6 s after start, then every 15 s, its floor.
RENEW_EARLY = {"SPOTBROKER_CREDENTIALS_LEAD_SECONDS": "894"}


@pytest.fixture
def azure(monkeypatch):
    fake = AzureFake().start()
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_USE_EMULATOR", "AZURE_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"AZURE_STORAGE_ACCOUNT_NAME": fake.account, "AZURE_STORAGE_ACCOUNT_KEY": fake.key,
                        "AZURE_STORAGE_ENDPOINT": fake.endpoint}.items():
        monkeypatch.setenv(name, value)
    yield fake
    fake.stop()


@pytest.fixture
def settings(settings, azure):
    settings.checkpoint_root = f"az://{CONTAINER}/root"
    settings.node_credentials_seconds = 900
    return settings


def test_a_job_flushes_and_resumes_from_azure_with_only_its_sas_tokens(api, team_headers, settings, azure,
                                                                        monkeypatch):
    from spotbroker.broker.launch import azure_sas

    minted, mint = [], azure_sas.mint  # the places each mint was for: the launch's, then the agent's renewals
    monkeypatch.setattr(azure_sas, "mint", lambda settings, scope: minted.append(scope.write) or mint(settings, scope))
    h = team_headers("vision")
    job_id = api.post("/v1/jobs", json={"name": "train", "run": shlex.join(TRAIN), "max_restarts": 0,
                                        "checkpoint": CODE_INTERVAL,
                                        "envs": RENEW_EARLY, "resources": {"accelerators": "T4:1"}},
                      headers=h).json()["id"]
    job = wait_state(api, h, job_id, {"RUNNING"}, timeout=60)
    first_id = job["attempts"][0]["id"]
    first_dir = f"root/vision/{job_id}/{first_id}/"
    wait_for(lambda: "step=12 " in api.get(f"/v1/jobs/{job_id}/logs", headers=h).text, timeout=60,
             what="training to be under way")
    assert any(b.startswith(first_dir) and b.endswith("/MANIFEST.json") for _, b in azure.objects)
    wait_for(lambda: minted.count(first_dir) >= 2, timeout=30, what="the agent to renew its tokens")
    before_preemption = len(azure.requests)
    assert api.post(f"/v1/jobs/{job_id}/simulate-preemption", headers=h).status_code == 202

    job = wait_state(api, h, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    assert job["state"] == "SUCCEEDED", (job, api.get(f"/v1/jobs/{job_id}/logs", headers=h).text[-3000:])
    first, second = job["attempts"]
    assert first["state"] == "PREEMPTED"
    events = api.get(f"/v1/jobs/{job_id}/events", headers=h).json()["events"]
    resumed = next((e for e in events if e["type"] == "resumed" and e["attempt_id"] == second["id"]), None)
    assert resumed and resumed["data"]["step"] > 0, events
    assert resumed["data"]["uri"].startswith(f"az://{CONTAINER}/{first_dir}step-")
    second_dir = f"root/vision/{job_id}/{second['id']}/"
    assert any(b.startswith(second_dir) and b.endswith("/MANIFEST.json") for _, b in azure.objects)
    # Every request carried a directory SAS (never a container one); the second attempt read the first's
    # checkpoint (its token for the job's directory) and wrote only its own directory.
    assert azure.requests and {sr for _, _, sr in azure.requests} == {"d"}
    later = azure.requests[before_preemption:]
    assert any(op == "read" and blob.startswith(first_dir) for op, blob, _ in later)
    assert all(blob.startswith((first_dir, second_dir)) for op, blob, _ in azure.requests if op == "write")


def test_the_agent_renews_the_tokens_over_its_channel(api, team_headers, settings, azure):
    from spotbroker.broker.recovery.agent_channel import agent_token

    h = team_headers("vision")
    job_id = api.post("/v1/jobs", json={"name": "renew", "run": "sleep 30", "resources": {"accelerators": "T4:1"},
                                        "envs": RENEW_EARLY}, headers=h).json()["id"]
    attempt_id = wait_state(api, h, job_id, {"RUNNING"}, timeout=60)["attempts"][0]["id"]
    bearer = {"Authorization": f"Bearer {agent_token(settings.signing_key(), attempt_id)}"}
    answer = api.post("/v1/agent/credentials", headers=bearer).json()
    assert answer["provider"] == "az" and answer["bucket"] == CONTAINER
    assert answer["options"] == {"account": azure.account, "endpoint": azure.endpoint}
    assert {parse_qs(t)["sr"][0] for t in answer["credentials"].values()} == {"d"}
    assert azure.key not in str(answer)
    api.post(f"/v1/jobs/{job_id}/cancel", headers=h)
