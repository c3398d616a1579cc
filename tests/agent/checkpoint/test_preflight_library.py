"""The checkpoint library under SPOTBROKER_PREFLIGHT=1: the trainer stops
after `steps` steps, once its state was saved and loaded back into fresh
objects, and exits 0; a state that cannot be loaded fails the run; nothing
is written to the job's storage."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import sys, torch
    from spotbroker.agent.checkpoint import Checkpointer

    class Unloadable:
        def state_dict(self):
            return {"n": 1}
        def load_state_dict(self, state):
            raise ValueError("this state cannot be loaded")

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stateful = {"bad": Unloadable()} if "--bad" in sys.argv else None
    ckpt = Checkpointer(model, opt, every_steps=1, stateful=stateful, handle_signal=False)
    print("device", ckpt.device, flush=True)
    model.to(ckpt.device)
    for step in range(ckpt.restore(), 2 if "--short" in sys.argv else 100):
        loss = model(torch.randn(8, 4, device=ckpt.device)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        print("step", step + 1, flush=True)
        ckpt.step(step + 1)
    ckpt.close()
    print("ran to the end", flush=True)
""")


def run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "t.py"
    script.write_text(SCRIPT)
    store = tmp_path / "store"
    full = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    full.update({"CHECKPOINT_URI": store.as_uri(), "TMPDIR": str(tmp_path), **env})
    return subprocess.run([sys.executable, str(script), *args], env=full, capture_output=True, text=True,
                          timeout=120)


def test_a_preflight_stops_after_its_steps_with_a_save_and_restore(tmp_path):
    done = run(tmp_path, SPOTBROKER_PREFLIGHT="1", SPOTBROKER_PREFLIGHT_STEPS="3", CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 0, done.stderr
    assert "device cpu" in done.stdout
    assert [line for line in done.stdout.splitlines() if line.startswith("step")] == ["step 1", "step 2", "step 3"]
    assert "pre-flight passed" in done.stdout and "ran to the end" not in done.stdout
    assert not (tmp_path / "store").exists()  # the job's storage: untouched
    assert not list(tmp_path.glob("spotbroker-preflight-*"))  # its own save: cleaned up


def test_an_unloadable_state_fails_the_preflight(tmp_path):
    done = run(tmp_path, "--bad", SPOTBROKER_PREFLIGHT="1")
    assert done.returncode != 0
    assert "does not load into stateful.bad" in done.stderr and "this state cannot be loaded" in done.stderr
    assert "step 2" in done.stdout and "step 3" not in done.stdout


def test_a_run_shorter_than_the_preflight_is_checked_at_close(tmp_path):
    done = run(tmp_path, "--short", SPOTBROKER_PREFLIGHT="1", SPOTBROKER_PREFLIGHT_STEPS="5")
    assert done.returncode == 0 and "ran to the end" in done.stdout, done.stderr
    bad = run(tmp_path, "--short", "--bad", SPOTBROKER_PREFLIGHT="1", SPOTBROKER_PREFLIGHT_STEPS="5")
    assert bad.returncode != 0 and "does not load into stateful.bad" in bad.stderr
    assert not list(tmp_path.glob("spotbroker-preflight-*"))


def test_without_a_preflight_the_library_runs_as_before(tmp_path):
    done = run(tmp_path, "--bad")  # the bad state is only ever loaded on a resume: the run goes on
    assert done.returncode == 0, done.stderr
    assert "ran to the end" in done.stdout and "pre-flight" not in done.stdout
    assert (tmp_path / "store").exists()
