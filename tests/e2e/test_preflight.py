"""The CPU pre-flight end to end, through the real server, agent and
checkpoint library on the local launcher: a script that would crash on a
GPU (a shape error in its first batch, a state that cannot be loaded back)
fails the job before any GPU attempt is launched, with the error's last
lines in its events; a script that passes goes on to its GPU attempt, which
starts from step 0. Each fails with `preflight` off: the GPU attempt would
be launched."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.helpers import timeline, wait_for, wait_state

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]
TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"
GPU = {"accelerators": "V100:1", "infra": "aws"}

SMALL = textwrap.dedent("""
    import sys, torch
    from spotbroker.agent.checkpoint import Checkpointer

    class Unloadable:  # saves fine; its load raises, as a renamed or reshaped state does
        def state_dict(self):
            return {"version": 2}
        def load_state_dict(self, state):
            raise KeyError("vocab")

    model = torch.nn.Linear(16, 4)
    opt = torch.optim.AdamW(model.parameters())
    bad = "--unloadable" in sys.argv
    ckpt = Checkpointer(model, opt, every_steps=100, stateful={"tokenizer": Unloadable()} if bad else None)
    model.to(ckpt.device)
    width = 15 if "--shape-error" in sys.argv else 16  # the data's width, one short of the model's
    for step in range(ckpt.restore(), 1000):
        loss = model(torch.randn(8, width, device=ckpt.device)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        print(f"step={step + 1}", flush=True)
        ckpt.step(step + 1)
    ckpt.close()
""")


def submit(api, h, job_scratch: Path, run: str, preflight=True, **spec) -> int:
    script = job_scratch / "small.py"
    script.write_text(SMALL)
    body = {"name": "pf", "setup": f"cp {shlex.quote(str(script))} {shlex.quote(str(TRAIN))} .", "run": run,
            "resources": GPU, "preflight": preflight, **spec}
    r = api.post("/v1/jobs", json=body, headers=h)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def failed_preflight(api, h, job_id: int) -> tuple[dict, dict]:
    job = wait_state(api, h, job_id, {"FAILED", "SUCCEEDED", "CANCELLED"}, timeout=120)
    assert job["state"] == "FAILED", timeline(api, h, job_id)
    (attempt,) = job["attempts"]  # the pre-flight only: no GPU was launched
    assert attempt["preflight"] and attempt["accelerator"] is None and attempt["state"] == "FAILED"
    assert attempt["cloud"] == "aws" and attempt["instance_type"].startswith(("m", "c"))  # a CPU type
    assert job["reason"].startswith("preflight_failed") and "no GPU was launched" in job["reason"]
    events = api.get(f"/v1/jobs/{job_id}/events", headers=h).json()["events"]
    failed = next(e["data"] for e in events if e["type"] == "preflight_failed")
    pf = job["preflight"]
    assert pf["status"] == "failed" and pf["tail"] == failed["tail"]
    assert pf["gpu_instance_type"] == "p3.2xlarge" and pf["num_nodes"] == 1 and pf["seconds"] > 0
    assert pf["gpu_would_have_cost"] == pytest.approx(pf["gpu_price_per_hour"] * pf["seconds"] / 3600, abs=1e-6)
    assert pf["gpu_would_have_cost"] > 0 and pf["cost"] >= 0
    return job, failed


def test_a_shape_error_fails_the_preflight_before_any_gpu_launch(api, team_headers, job_scratch, settings, tmp_path):
    h = team_headers()
    job_id = submit(api, h, job_scratch, "python small.py --shape-error")
    _, failed = failed_preflight(api, h, job_id)
    assert "mat1 and mat2 shapes cannot be multiplied" in failed["tail"], failed
    assert failed["why"] == "exit code 1"
    # `spotbroker job ID` says it too: the error's last lines, and what the GPU launch would have cost
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_") and k not in ("COLUMNS",)},
           "HOME": str(tmp_path), "SPOTBROKER_URL": f"http://127.0.0.1:{settings.port}",
           "SPOTBROKER_TOKEN": h["Authorization"].split()[1]}
    shown = subprocess.run([sys.executable, "-m", "spotbroker.broker.cli", "job", str(job_id)], env=env,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    out = " ".join(shown.stdout.split())
    assert "pre-flight: failed (exit code 1)" in out and "mat1 and mat2 shapes cannot be multiplied" in out, out
    assert "the GPU launch (p3.2xlarge" in out and "would have cost $" in out, out
    # and the team's dashboard page: the pre-flight, what it cost, what the GPU launch would have
    page = api.get("/dashboard/teams/ml", headers=h)
    assert page.status_code == 200, page.text[:300]
    row = page.text[page.text.index(f'data-preflight="{job_id}"'):].split("</tr>")[0]
    pf = api.get(f"/v1/jobs/{job_id}", headers=h).json()["preflight"]
    assert "failed: exit code 1" in row and "p3.2xlarge x 1" in row and f"${pf['gpu_would_have_cost']:.4f}" in row
    assert "0 passed and 1 failed before any GPU was rented" in page.text


def test_an_unloadable_checkpoint_fails_the_preflight(api, team_headers, job_scratch):
    h = team_headers()
    job_id = submit(api, h, job_scratch, "python small.py --unloadable")
    _, failed = failed_preflight(api, h, job_id)
    assert "does not load into stateful.tokenizer" in failed["tail"] and "vocab" in failed["tail"], failed
    logs = api.get(f"/v1/jobs/{job_id}/logs", headers=h).text
    assert "step=2" in logs and "step=3" not in logs  # stopped at its second step, at the save


def test_a_passing_preflight_is_followed_by_the_gpu_attempt(api, team_headers, job_scratch):
    h = team_headers()
    run = "python train.py --steps 20 --seed 3 --every-steps 1000 --log-every 1"
    pf = {"run": f"echo PF=$SPOTBROKER_PREFLIGHT CUDA=[$CUDA_VISIBLE_DEVICES] && {run}", "steps": 3}
    job_id = submit(api, h, job_scratch, run, preflight=pf, num_nodes=2)
    job = wait_state(api, h, job_id, {"FAILED", "SUCCEEDED", "CANCELLED"}, timeout=180)
    assert job["state"] == "SUCCEEDED", timeline(api, h, job_id)
    trial, gpu = job["attempts"]
    assert (trial["preflight"], trial["accelerator"], trial["num_nodes"], trial["state"]) \
        == (True, None, 1, "SUCCEEDED")
    assert (gpu["preflight"], gpu["accelerator"], gpu["num_nodes"], gpu["state"]) == (False, "V100", 2, "SUCCEEDED")
    trial_log = api.get(f"/v1/jobs/{job_id}/logs", params={"attempt": trial["id"]}, headers=h).text
    assert "PF=1 CUDA=[]" in trial_log and "pre-flight passed" in trial_log
    assert "step=3 " in trial_log and "step=4 " not in trial_log and "final_loss" not in trial_log
    gpu_log = api.get(f"/v1/jobs/{job_id}/logs", params={"attempt": gpu["id"]}, headers=h).text
    assert "start_step=0" in gpu_log and "step=20 " in gpu_log and "final_loss=" in gpu_log  # nothing resumed
    events = api.get(f"/v1/jobs/{job_id}/events", headers=h).json()["events"]
    passed = next(e for e in events if e["type"] == "preflight_passed")
    assert passed["attempt_id"] == trial["id"] and passed["data"]["seconds"] > 0 and "cost" in passed["data"]
    assert job["preflight"]["status"] == "passed" and job["preflight"]["num_nodes"] == 2
    assert not any(e["type"] == "checkpoint_committed" and e["attempt_id"] == trial["id"] for e in events)


def test_a_preflight_past_its_timeout_fails_the_job_and_is_stopped(api, team_headers, job_scratch, settings):
    h = team_headers()
    job_id = submit(api, h, job_scratch, "echo started && sleep 600", preflight={"timeout": 10})
    job = wait_state(api, h, job_id, {"FAILED", "SUCCEEDED", "CANCELLED"}, timeout=90)
    assert job["state"] == "FAILED" and "timed out after 10 s" in job["reason"], timeline(api, h, job_id)
    (attempt,) = job["attempts"]
    assert attempt["preflight"] and attempt["state"] == "FAILED"
    assert job["preflight"]["status"] == "failed" and "started" in job["preflight"]["tail"]
    # the release phase stops what it ran: the node records an exit
    exit_file = Path(settings.data_dir) / "runs" / str(attempt["id"]) / "exit-0"
    wait_for(exit_file.exists, timeout=60, what="the pre-flight's node to be stopped")
