"""agent/checkpoint/reports.py: metrics reported to the agent, the best
weights checkpointed under early_stop, and the stop the broker asks for."""
from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from spotbroker.agent import protocol  # noqa: E402
from spotbroker.agent.checkpoint import Checkpointer, list_checkpoints  # noqa: E402

RULE = json.dumps({"metric": "val_loss", "mode": "min", "min_delta": 0.01, "min_steps": 20, "patience": 3})


@pytest.fixture(autouse=True)
def _agent_environment(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name in (protocol.ENV_CHECKPOINT_URI, protocol.ENV_CHECKPOINT_ROOT, protocol.ENV_RESUME_FROM,
                 protocol.ENV_CONTROL_DIR, protocol.ENV_EARLY_STOP):
        monkeypatch.delenv(name, raising=False)
    previous = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, previous)


def events(control: Path, kind: str) -> list[dict[str, Any]]:
    path = control / protocol.EVENTS_FILE
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [e for e in lines if e["type"] == kind]


def make(tmp_path: Path) -> tuple[torch.nn.Linear, Checkpointer, Path]:
    control = tmp_path / "control"
    control.mkdir()
    model = torch.nn.Linear(1, 1, bias=False)
    ckpt = Checkpointer(model, uri=f"file://{tmp_path}/ckpt", every_seconds=None, control_dir=control)
    return model, ckpt, control


def test_a_report_reaches_the_agent_and_bad_metrics_are_dropped(tmp_path: Path) -> None:
    _, ckpt, control = make(tmp_path)
    assert ckpt.report(10, val_loss=0.5, accuracy=0.8, **{"bad name!": 1.0}, nan=float("nan"), text="x") is True
    ckpt.close()
    (event,) = events(control, protocol.METRICS)
    assert event["data"] == {"step": 10, "values": {"val_loss": 0.5, "accuracy": 0.8}}
    assert not list_checkpoints(f"file://{tmp_path}/ckpt")  # no early_stop: no best checkpoints


def test_under_early_stop_each_better_report_from_min_steps_is_checkpointed(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(protocol.ENV_EARLY_STOP, RULE)
    model, ckpt, _ = make(tmp_path)
    curve = {10: 0.1, 20: 0.9, 30: 0.5, 40: 0.495, 50: 0.3, 60: 0.4}  # step 10 is before min_steps
    for step, loss in curve.items():
        with torch.no_grad():
            model.weight.fill_(step)
        ckpt.report(step, val_loss=loss)
        ckpt.wait()
    ckpt.close()
    saved = sorted(c.step for c in list_checkpoints(f"file://{tmp_path}/ckpt"))
    assert saved == [20, 30, 50]  # 40 is not better by min_delta; 60 is worse

    restored = torch.nn.Linear(1, 1, bias=False)
    again = Checkpointer(restored, uri=f"file://{tmp_path}/ckpt", every_seconds=None, handle_signal=False)
    assert again.restore() == 50 and restored.weight.item() == 50.0
    assert again.extra["spotbroker.best"] == [50, 0.3]  # a resumed attempt knows the best so far
    again.close()


def test_a_stop_request_checkpoints_the_step_and_says_should_stop(tmp_path: Path) -> None:
    _, ckpt, control = make(tmp_path)
    ckpt.step(5)
    assert not ckpt.should_stop
    (control / protocol.STOP_FILE).write_text(json.dumps({"reason": protocol.EARLY_STOP}))
    ckpt.step(6)
    assert ckpt.should_stop and ckpt.report(6, val_loss=1.0) is False
    ckpt.close()
    (committed,) = events(control, protocol.CHECKPOINT_COMMITTED)
    assert (committed["data"]["step"], committed["data"]["reason"]) == (6, protocol.EARLY_STOP)


def test_keep_last_never_deletes_the_best_weights(tmp_path, monkeypatch) -> None:
    """keep_last=1 deleted every `best` checkpoint before the broker could mark the best
    one kept: the job said it kept step 750 of a directory that was gone."""
    monkeypatch.setenv(protocol.ENV_EARLY_STOP, RULE)
    model = torch.nn.Linear(1, 1, bias=False)
    ckpt = Checkpointer(model, uri=f"file://{tmp_path}/ckpt", every_steps=5, every_seconds=None,
                        control_dir=tmp_path / "control", keep_last=1)
    for step in range(1, 41):
        ckpt.step(step)
        ckpt.wait()
        if step % 10 == 0:
            ckpt.report(step, val_loss={20: 0.5, 30: 0.2}.get(step, 0.9))
            ckpt.wait()
    ckpt.close()
    saved = sorted(c.step for c in list_checkpoints(f"file://{tmp_path}/ckpt"))
    assert saved == [30, 40], saved  # the best (30) and the newest
