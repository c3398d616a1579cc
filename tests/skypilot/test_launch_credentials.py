"""A SkyPilot node gets its storage credentials (minted per attempt, scoped
to its job: broker/launch/storage_credentials.py) in SkyPilot's `secrets`
only: never in `envs`, the request's repr or the launcher's logs. Real
SkyPilot Task, offline (the bundled catalog); nothing is launched."""
from __future__ import annotations

import json
import logging

import pytest

from spotbroker.agent import protocol
from spotbroker.broker.launch.base import LaunchRequest
from spotbroker.broker.pricing.offers import Placement

pytest.importorskip("sky", reason="SkyPilot (the broker extra) is not installed")

STORAGE = {protocol.ENV_STORAGE_CREDENTIALS: json.dumps({
    "provider": "s3", "expires_at": "2026-11-27T07:00:00+00:00", "bucket": "ckpt", "options": {"region": "us-east-1"},
    "credentials": {"access_key_id": "ASIANODEKEY", "secret_access_key": "node-secret-5e1f",
                    "token": "node-session-token-77"}})}
# The user's own keys (their dataset's): on the node as they gave them.
USER_SECRETS = {"AWS_ACCESS_KEY_ID": "AKIAUSEROWN", "AWS_SECRET_ACCESS_KEY": "user-secret-9a"}


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    from spotbroker.broker.launch.skypilot.launcher import SkyPilotLauncher

    wheels = tmp_path_factory.mktemp("wheels")
    (wheels / "spotbroker-0.1.0-py3-none-any.whl").write_bytes(b"")
    launcher = SkyPilotLauncher(wheels, prefix="sbcreds")
    yield launcher
    launcher.close()


def test_the_nodes_storage_credentials_go_in_secrets_only_under_spotbrokers_name(launcher, caplog):
    """...and the user's own AWS keys in `secrets` reach the node unchanged (before, the node's scoped keys
    replaced them in the standard variables: a trainer reading its own bucket got a 403)."""
    where = Placement(cloud="aws", region="us-east-1", zone="us-east-1b", zone_id=None, instance_type="g4dn.xlarge",
                      accelerator="T4", accelerator_count=1, use_spot=True, price_per_hour=0.2)
    request = LaunchRequest(attempt_id=7, job_id=3, team="ml", run="python train.py", setup=None, envs={},
                            num_nodes=1, placement=where, extra_env={"SPOTBROKER_AGENT_TOKEN": "agent-token"},
                            storage_env=STORAGE, secrets=USER_SECRETS)
    assert "node-secret-5e1f" not in repr(request) and "ASIANODEKEY" not in repr(request)
    with caplog.at_level(logging.DEBUG):
        task = launcher.task(request)
    secrets = {k: v.get_secret_value() for k, v in task.secrets.items()}
    assert {k: secrets[k] for k in STORAGE} == STORAGE
    assert {k: secrets[k] for k in USER_SECRETS} == USER_SECRETS
    assert not any(k.startswith(("AWS_", "GOOGLE_", "AZURE_")) for k in task.envs)
    program = task.run if isinstance(task.run, str) else ""
    assert "ASIANODEKEY" not in program and "AWS_" not in program  # the wrapped run exports none of them
    envs = json.dumps(task.envs)
    assert not any(value in envs for value in ("ASIANODEKEY", "node-secret-5e1f", "node-session-token-77"))
    assert not set(STORAGE) & set(task.envs)
    assert "node-secret-5e1f" not in caplog.text and "node-session-token-77" not in caplog.text
