"""`teams policy set|show`, and why jobs wait as the CLI shows it (`jobs`'
REASON column, `submit`'s warnings), run as a user runs them against a
real server."""
from __future__ import annotations

import json

from conftest import ADMIN_TOKEN
from support.cli import cells, spotbroker
from support.helpers import team_token, wait_state


def test_the_admin_sets_a_policy_by_flags_and_file_and_a_team_shows_its_own(api, env, tmp_path):
    token = team_token(api, "ml", ADMIN_TOKEN)
    team_token(api, "cv", ADMIN_TOKEN)
    admin = {**env, "SPOTBROKER_TOKEN": token, "SPOTBROKER_ADMIN_TOKEN": ADMIN_TOKEN}
    mine = {**env, "SPOTBROKER_TOKEN": token}

    r = spotbroker("teams", "policy", "set", "ml", "--env", "MIXED_PRECISION=bf16", "--allow", "T4,L4",
                   "--max-nodes", "2", "--max-gpus-running", "8", "--max-price-per-hour", "12.5", env=admin)
    assert r.returncode == 0, r.stderr
    assert cells(r.stdout, "max_nodes")[1] == "2" and cells(r.stdout, "allowed_accelerators")[1] == "T4, L4"
    r = spotbroker("teams", "policy", "set", "ml", "--retention-days", "30", "--unset", "max_nodes", env=admin)
    assert r.returncode == 0, r.stderr                         # flags change the policy in force
    shown = json.loads(spotbroker("teams", "policy", "show", "--json", env=mine).stdout)   # its own team
    assert shown == {"team": "ml", "envs": {"MIXED_PRECISION": "bf16"}, "allowed_accelerators": ["T4", "L4"],
                     "max_price_per_hour": 12.5, "max_gpus_running": 8, "checkpoint_retention_days": 30.0}
    r = spotbroker("teams", "policy", "show", env=mine)
    assert cells(r.stdout, "max_price_per_hour")[1] == "$12.5/h per job" and "team ml" in r.stdout

    file = tmp_path / "policy.yaml"
    file.write_text("max_nodes: 4\nearly_stop: {metric: val_loss, patience: 3}\ncheckpoint: {interval: 900}\n")
    r = spotbroker("teams", "policy", "set", "ml", "--file", str(file), "--max-gpus-running", "16", env=admin)
    assert r.returncode == 0, r.stderr                         # the file is the whole policy
    shown = json.loads(spotbroker("teams", "policy", "show", "ml", "--json", env=admin).stdout)
    assert shown == {"team": "ml", "envs": {}, "max_nodes": 4, "max_gpus_running": 16,
                     "early_stop": {"metric": "val_loss", "mode": "min", "patience": 3, "min_delta": 0.0,
                                    "min_steps": 0},  # the spec's rule, its defaults filled in
                     "checkpoint": {"interval": 900}}

    file.write_text("max_nodes: 4\nmax_nodes: 5\n")
    r = spotbroker("teams", "policy", "set", "ml", "--file", str(file), env=admin)
    assert r.returncode == 1 and f"{file}:2" in r.stderr and "Traceback" not in r.stderr
    file.write_text("max_nodes: lots\n")
    r = spotbroker("teams", "policy", "set", "ml", "--file", str(file), env=admin)
    assert r.returncode == 1 and str(file) in r.stderr and "max_nodes" in r.stderr and "Traceback" not in r.stderr
    r = spotbroker("teams", "policy", "set", "ml", "--max-nodes", "1", env=mine)   # a team's token: refused
    assert r.returncode == 1 and "admin" in r.stderr.lower() and "Traceback" not in r.stderr
    r = spotbroker("teams", "policy", "show", "cv", env=mine)                       # another team's: refused
    assert r.returncode == 1 and "own team" in r.stderr


def test_a_held_submission_warns_and_jobs_shows_why_it_waits(api, env, tmp_path):
    token = team_token(api, "ml", ADMIN_TOKEN)
    mine = {**env, "SPOTBROKER_TOKEN": token}
    h = {"Authorization": f"Bearer {token}"}
    assert api.put("/v1/teams/ml/policy", json={"max_gpus_running": 1},
                   headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 200
    running = api.post("/v1/jobs", json={"name": "busy", "run": "sleep 60", "resources": {"accelerators": "T4:1"}},
                       headers=h).json()
    wait_state(api, h, running["id"], {"RUNNING"}, timeout=60)
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"name": "second", "run": "true", "resources": {"accelerators": "T4:1"}}))
    r = spotbroker("submit", str(spec), env=mine)
    assert r.returncode == 0, r.stderr
    assert f"{spec}: warning: state: the job is HELD: held by a limit: team max 1 GPUs at once, 1 running" \
        in r.stderr
    assert "HELD (held by a limit" in r.stdout
    r = spotbroker("jobs", env=mine)
    assert cells(r.stdout, "second")[3].startswith("held by a limit: team max 1") and "REASON" in r.stdout
    assert cells(r.stdout, "busy")[3] == "-"
    api.post(f"/v1/jobs/{running['id']}/cancel", headers=h)
