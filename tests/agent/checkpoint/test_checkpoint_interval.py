"""The broker's checkpoint interval reaching the library: the agent writes
interval.json (agent/flush.py), the library adopts it instead of the
trainer's own every_seconds / every_steps (agent/checkpoint/interval.py)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from spotbroker.agent import protocol  # noqa: E402
from spotbroker.agent.checkpoint import Checkpointer, list_checkpoints  # noqa: E402
from spotbroker.agent.flush import write_interval_file  # noqa: E402


@pytest.fixture(autouse=True)
def _no_agent_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (protocol.ENV_CHECKPOINT_URI, protocol.ENV_CHECKPOINT_ROOT, protocol.ENV_RESUME_FROM,
                 protocol.ENV_CONTROL_DIR):
        monkeypatch.delenv(name, raising=False)


def periodic_saves(tmp_path: Path, seconds: float | None, run_s: float = 2.0) -> tuple[int, list[dict]]:
    """Train for `run_s` under a trainer that asks for a save every 1000 steps
    or 10 minutes, with the broker's `seconds` written by the agent (None: no file)."""
    control = tmp_path / "control"
    control.mkdir()
    if seconds is not None:
        write_interval_file(control, seconds)
    model = torch.nn.Linear(8, 8)
    ckpt = Checkpointer(model, uri=f"file://{tmp_path}/ckpt", every_steps=1000, every_seconds=600,
                        control_dir=control, handle_signal=False)
    step, end = 0, time.monotonic() + run_s
    while time.monotonic() < end:
        step += 1
        time.sleep(0.02)
        ckpt.step(step)
    ckpt.close()
    log = control / protocol.EVENTS_FILE
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return len(list_checkpoints(f"file://{tmp_path}/ckpt")), events


def test_the_library_saves_at_the_brokers_interval_instead_of_its_own(tmp_path):
    saved, events = periodic_saves(tmp_path, 0.3)
    assert saved >= 4  # ~2 s at 0.3 s: the trainer's own (1000 steps, 10 min) would make none
    adopted = [e["data"] for e in events if e["type"] == protocol.INTERVAL_ADOPTED]
    assert adopted == [{"seconds": 0.3, "code_seconds": 600}]


def test_without_the_brokers_interval_the_trainers_own_stands(tmp_path):
    saved, events = periodic_saves(tmp_path, None, run_s=1.0)
    assert saved == 0 and not [e for e in events if e["type"] == protocol.INTERVAL_ADOPTED]


def test_a_new_interval_is_adopted_mid_run_and_null_gives_the_trainers_own_back(tmp_path):
    control = tmp_path / "control"
    control.mkdir()
    ckpt = Checkpointer(torch.nn.Linear(4, 4), uri=f"file://{tmp_path}/ckpt", every_steps=None, every_seconds=600,
                        control_dir=control, handle_signal=False)
    assert ckpt._interval.poll() is None
    write_interval_file(control, 120.0)
    time.sleep(0.6)
    assert ckpt._interval.poll() == 120.0
    write_interval_file(control, None)
    time.sleep(0.6)
    assert ckpt._interval.poll() is None
    ckpt.close()
