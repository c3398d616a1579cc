"""The checkpoint library with the state in GPU memory.

A trainer's model and optimizer live on the GPU: the snapshot copies them to
(pinned) host memory without blocking on each tensor, then synchronises
before the upload reads the copy. These tests check that what is committed
is the state of its step exactly, whatever the GPU does afterwards, and that
a GPU checkpoint restores onto the GPU and onto a host without one (a run
resumed on another machine). They need a CUDA device: none is on the CI
machines, so there they are skipped with that reason; they ran on an H200
(docs/benchmarks.md, "State in GPU memory").
"""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # the user's own: the package never depends on it

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")

from spotbroker.agent import protocol  # noqa: E402
from spotbroker.agent.checkpoint import Checkpointer, list_checkpoints  # noqa: E402

CUDA = "cuda"


@pytest.fixture(autouse=True)
def _no_agent_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (protocol.ENV_CHECKPOINT_URI, protocol.ENV_CHECKPOINT_ROOT, protocol.ENV_RESUME_FROM,
                 protocol.ENV_CONTROL_DIR):
        monkeypatch.delenv(name, raising=False)
    previous = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, previous)


def make_run(seed: int, device: str = CUDA, width: int = 1024) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 8)).to(device)
    return net, torch.optim.AdamW(net.parameters(), lr=1e-2)


def train(net: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    device = next(net.parameters()).device
    for _ in range(steps):
        loss = net(torch.randn(64, net[0].in_features, device=device)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def host_copy(state: dict) -> dict:
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def test_a_gpu_state_saves_and_restores_onto_the_gpu(tmp_path: Path) -> None:
    net, opt = make_run(0)
    train(net, opt, 3)
    ck = Checkpointer(net, opt, uri=f"file://{tmp_path}/a1", every_seconds=None, part_bytes=1 << 20)
    assert ck.save(3) is not None
    expected, cuda_rng = host_copy(net.state_dict()), torch.cuda.get_rng_state()
    ck.close()

    torch.cuda.manual_seed(123)
    net2, opt2 = make_run(7)
    ck2 = Checkpointer(net2, opt2, uri=f"file://{tmp_path}/a2", job_uri=f"file://{tmp_path}")
    assert ck2.restore() == 3
    for name, value in net2.state_dict().items():
        assert value.device.type == CUDA
        assert torch.equal(value.cpu(), expected[name])
    assert all(s["exp_avg"].device.type == CUDA for s in opt2.state.values())
    assert torch.equal(torch.cuda.get_rng_state(), cuda_rng)
    ck2.close()


@pytest.mark.parametrize("half", [None, "bf16"])
def test_a_periodic_gpu_snapshot_holds_its_step_while_training_goes_on(tmp_path: Path, half: str | None) -> None:
    """The copy to host memory is asynchronous on the GPU: training's next
    steps are queued right behind it and must not leak into the snapshot."""
    net, opt = make_run(0, width=2048)
    train(net, opt, 1)
    ck = Checkpointer(net, opt, uri=f"file://{tmp_path}/a1", every_steps=2, every_seconds=None,
                      part_bytes=1 << 20, half=half)
    ck.step(1)
    if ck._uploader.host_preparing is not None:
        ck._uploader.host_preparing.join()
    ck.step(2)  # the snapshot is taken here; the upload runs in the background
    expected = host_copy(net.state_dict())
    train(net, opt, 5)  # the GPU changes every weight under the upload
    assert ck.wait() is not None
    ck.close()

    net2, opt2 = make_run(7, width=2048)
    ck2 = Checkpointer(net2, opt2, uri=f"file://{tmp_path}/a2", job_uri=f"file://{tmp_path}")
    assert ck2.restore() == 2
    tolerance = 1e-2 if half else 0.0
    for name, value in expected.items():
        assert torch.allclose(net2.state_dict()[name].cpu().double(), value.double(), rtol=tolerance, atol=tolerance)
    ck2.close()


def test_a_flush_from_the_gpu_commits_at_the_next_step_boundary(tmp_path: Path) -> None:
    control = tmp_path / "control"
    net, opt = make_run(0)
    ck = Checkpointer(net, opt, uri=f"file://{tmp_path}/a1", control_dir=control, every_seconds=None)
    (control / protocol.FLUSH_FILE).write_text(json.dumps({"reason": "preemption_notice"}))
    os.kill(os.getpid(), getattr(signal, protocol.FLUSH_SIGNAL))
    train(net, opt, 1)
    expected = host_copy(net.state_dict())
    ck.step(4)
    assert [c.step for c in list_checkpoints(f"file://{tmp_path}/a1")] == [4]
    ck.close()
    net2, opt2 = make_run(7)
    assert Checkpointer(net2, opt2, uri=f"file://{tmp_path}/a1").restore() == 4
    assert all(torch.equal(v.cpu(), expected[k]) for k, v in net2.state_dict().items())


def test_a_gpu_checkpoint_resumes_on_a_host_without_that_gpu(tmp_path: Path) -> None:
    """The run moves to another machine: the model is built on the CPU there
    (or another device); the weights arrive where the model is."""
    net, opt = make_run(0)
    train(net, opt, 2)
    Checkpointer(net, opt, uri=f"file://{tmp_path}/a1", every_seconds=None).save(2)
    expected = host_copy(net.state_dict())

    cpu_net, cpu_opt = make_run(7, device="cpu")
    assert Checkpointer(cpu_net, cpu_opt, uri=f"file://{tmp_path}/a1").restore() == 2
    for name, value in cpu_net.state_dict().items():
        assert value.device.type == "cpu" and torch.equal(value, expected[name])
    train(cpu_net, cpu_opt, 1)  # the optimizer's moments came back usable on the CPU
