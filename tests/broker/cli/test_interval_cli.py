"""`spotbroker job ID` says the checkpoint interval in force and why."""
from __future__ import annotations

from conftest import ADMIN_TOKEN
from support.cli import spotbroker
from support.helpers import team_token, wait_for


def test_job_shows_the_checkpoint_interval_in_force_and_why(api, env):
    token = team_token(api, "ml", ADMIN_TOKEN)
    h = {"Authorization": f"Bearer {token}"}
    job_id = api.post("/v1/jobs", json={"run": "sleep 60", "resources": {"accelerators": "T4:1"}},
                      headers=h).json()["id"]
    interval = wait_for(lambda: api.get(f"/v1/jobs/{job_id}", headers=h).json()["checkpoint_interval"], timeout=60,
                        what="the interval in force")
    out = spotbroker("job", str(job_id), env={**env, "SPOTBROKER_TOKEN": token})
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert f"checkpoint interval: {interval['seconds'] / 60:.1f} min (auto)" in text
    assert "zone MTBF 3.43 h (0 reclaims" in text and "assumed C 30 s" in text
    api.post(f"/v1/jobs/{job_id}/cancel", headers=h)
