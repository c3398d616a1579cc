"""agent/checkpoint/: commit rule, verified restore, kills, flushes, options.

Object storage is moto's S3 server over real HTTP, or a local directory.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")  # the user's own: the package never depends on it

from spotbroker.agent import protocol  # noqa: E402
from spotbroker.agent.checkpoint import Checkpointer, CheckpointOptions, list_checkpoints, mark_keep  # noqa: E402
from spotbroker.agent.checkpoint.format import KEEP_MARKER, load_checkpoint  # noqa: E402
from spotbroker.agent.checkpoint.storage import Storage  # noqa: E402

REPO = Path(__file__).resolve().parents[3]




@pytest.fixture(params=["file", "s3"])
def root_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path}/ckpt"
    return request.getfixturevalue("s3_uri") + "/team/job"


@pytest.fixture(autouse=True)
def _no_agent_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests say explicitly what the agent would have put in the environment."""
    for name in (protocol.ENV_CHECKPOINT_URI, protocol.ENV_CHECKPOINT_ROOT, protocol.ENV_RESUME_FROM,
                 protocol.ENV_CONTROL_DIR):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _restore_sigusr1() -> Any:
    """Checkpointers take SIGUSR1 over (and leave it ignored when closed): put it back."""
    previous = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, previous)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)
        self.register_buffer("counts", torch.zeros(5, dtype=torch.int64))
        self.register_buffer("flag", torch.tensor(True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def make_run(seed: int = 0) -> tuple[Net, torch.optim.Optimizer, Any]:
    torch.manual_seed(seed)
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return net, opt, sched


def train(net: Net, opt: torch.optim.Optimizer, sched: Any, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(8, 16)
        loss = net(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        net.counts += 1


def same_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor):
            if not (x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)):
                return False
        elif isinstance(x, dict):
            if not same_state(x, y):
                return False
        elif x != y:
            return False
    return True


def events(control: Path) -> list[dict[str, Any]]:
    path = control / protocol.EVENTS_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# --------------------------------------------------------------------------
# Round trips and the commit rule


def test_save_and_restore_everything(root_uri: str) -> None:
    net, opt, sched = make_run()
    train(net, opt, sched, 3)
    ck = Checkpointer(net, opt, sched, uri=root_uri + "/attempt-1", part_bytes=1024, every_seconds=None)
    ck.extra.update(epoch=2, odd=torch.arange(12.0).reshape(3, 4).t(), empty=torch.zeros(0, 3),
                    half=torch.ones(3, dtype=torch.bfloat16))
    info = ck.save(3)
    assert info is not None and info.step == 3 and info.uri == root_uri + "/attempt-1/step-000000000003"
    expected = ({k: v.clone() for k, v in net.state_dict().items()}, opt.state_dict(), sched.state_dict())
    rng = torch.get_rng_state()
    ck.close()

    torch.manual_seed(99)  # different weights and RNG until restored
    net2, opt2, sched2 = make_run(seed=7)
    ck2 = Checkpointer(net2, opt2, sched2, uri=root_uri + "/attempt-2", job_uri=root_uri)
    assert ck2.restore() == 3
    assert same_state(net2.state_dict(), expected[0])
    # The module versions that load_state_dict reads travel with the weights.
    saved, _ = load_checkpoint(Storage(info.uri), workers=2)
    assert saved["components"]["model"]._metadata == net.state_dict()._metadata
    assert same_state(opt2.state_dict(), expected[1])
    assert sched2.state_dict() == expected[2]
    assert torch.equal(torch.get_rng_state(), rng)
    assert ck2.extra["epoch"] == 2
    assert torch.equal(ck2.extra["odd"], torch.arange(12.0).reshape(3, 4).t())
    assert ck2.extra["empty"].shape == (0, 3)
    assert ck2.extra["half"].dtype == torch.bfloat16
    # Training goes on identically from the restored state (RNG included).
    train(net2, opt2, sched2, 2)
    torch.set_rng_state(rng)
    train(net, opt, sched, 2)
    assert same_state(net.state_dict(), net2.state_dict())
    ck2.close()


def test_a_checkpoint_without_its_manifest_does_not_exist(root_uri: str) -> None:
    net, opt, sched = make_run()
    uri = root_uri + "/a1"
    ck = Checkpointer(net, opt, sched, uri=uri, part_bytes=2048)
    ck.save(1)
    step1 = {k: v.clone() for k, v in net.state_dict().items()}
    train(net, opt, sched, 1)

    def refuse(step: int) -> None:
        raise RuntimeError("killed before the manifest")

    ck._uploader.before_manifest = refuse
    assert ck.save(2) is None  # every object written, no manifest
    ck._uploader.before_manifest = None
    ck.save(3)
    Storage(uri).delete("step-000000000003/MANIFEST.json")  # objects there, manifest gone
    ck.close()

    assert [c.step for c in list_checkpoints(root_uri)] == [1]
    net2, opt2, sched2 = make_run(seed=5)
    assert Checkpointer(net2, opt2, sched2, uri=uri).restore() == 1
    assert same_state(net2.state_dict(), step1)


def test_no_uri_means_no_checkpoints(tmp_path: Path) -> None:
    net, opt, sched = make_run()
    ck = Checkpointer(net, opt, sched, every_steps=1)
    assert ck.restore() == 0
    ck.step(1)
    assert ck.save(1) is None
    ck.close()


def test_knobs_come_as_options_or_by_name(tmp_path: Path) -> None:
    options = CheckpointOptions(keep_last=2, part_bytes=4096)
    ck = Checkpointer(*make_run(), uri=f"file://{tmp_path}/a1", options=options, part_bytes=8192, half="bf16")
    assert (ck.keep_last, ck.part_bytes, ck.half) == (2, 8192, "bf16")  # a keyword wins over options=
    ck.close()
    with pytest.raises(ValueError, match="keep_last must be at least 1"):
        Checkpointer(*make_run(), keep_last=0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'keep_lats'"):
        Checkpointer(*make_run(), keep_lats=2)


OLD_CHECKPOINT = Path(__file__).parent / "data" / "checkpoint-before-the-package"


def test_a_checkpoint_written_before_the_library_became_a_package_loads(tmp_path: Path) -> None:
    """Its state.pkl names the tensor placeholders spotbroker.agent.checkpoint._TensorRef
    (written by the library when it was one module: a Linear(3, 2) after one SGD step,
    saved at step 7 with extra={"epoch": 3}); checkpoints written today keep that name."""
    shutil.copytree(OLD_CHECKPOINT, tmp_path / "old")
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    ck = Checkpointer(net, opt, uri=f"file://{tmp_path}/old", every_seconds=None, handle_signal=False)
    assert ck.restore() == 7
    with torch.no_grad():  # the weights it was written with, arange(6) / 8 and (0.5, -0.25), less one step
        assert torch.allclose(net.weight, torch.arange(6.0).reshape(2, 3) / 8 - 0.1, rtol=0, atol=1e-7)
        assert torch.allclose(net.bias, torch.tensor([0.5, -0.25]) - 0.1, rtol=0, atol=1e-7)
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], torch.ones(2, 3))
    assert ck.extra == {"epoch": 3}
    ck.save(8)
    ck.close()
    written = (tmp_path / "old" / "step-000000000008" / "state.pkl").read_bytes()
    assert b"spotbroker.agent.checkpoint" in written and b"_TensorRef" in written


def test_importing_the_library_does_not_import_torch() -> None:
    code = "import sys, spotbroker.agent.checkpoint; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------
# Restore: which checkpoint, and what it does with bad ones


def test_restore_picks_the_newest_across_attempts_or_resume_from(tmp_path: Path) -> None:
    job = f"file://{tmp_path}/job"
    net, opt, sched = make_run()
    for attempt, steps in (("a1", (2, 4)), ("a2", (6,)), ("a3", (5,))):
        ck = Checkpointer(net, opt, sched, uri=f"{job}/{attempt}")
        for step in steps:
            ck.save(step)
        ck.close()
    assert [c.step for c in list_checkpoints(job)] == [6, 5, 4, 2]
    assert Checkpointer(*make_run(), uri=f"{job}/a4", job_uri=job).restore() == 6
    resume = f"{job}/a1/step-000000000004"
    assert Checkpointer(*make_run(), uri=f"{job}/a4", job_uri=job, resume_from=resume).restore() == 4


def _flip_one_byte(store: Storage, key: str, seed: int) -> None:
    data = bytearray(store.get(key))
    at = random.Random(seed).randrange(len(data))
    data[at] ^= 0x01
    store.put(key, bytes(data))


def test_a_flipped_byte_is_detected_skipped_and_reported(root_uri: str, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    net, opt, sched = make_run()
    uri = root_uri + "/a1"
    ck = Checkpointer(net, opt, sched, uri=uri, part_bytes=1024)
    ck.save(1)
    good = {k: v.clone() for k, v in net.state_dict().items()}
    train(net, opt, sched, 1)
    ck.save(2)
    ck.close()
    _flip_one_byte(Storage(uri), "step-000000000002/part-00001.bin", seed=3)

    control = tmp_path / "control"
    net2, opt2, sched2 = make_run(seed=1)
    with caplog.at_level(logging.WARNING, logger="spotbroker.checkpoint"):
        ck2 = Checkpointer(net2, opt2, sched2, uri=root_uri + "/a2", job_uri=root_uri, control_dir=control)
        assert ck2.restore() == 1
    ck2.close()
    assert same_state(net2.state_dict(), good)
    assert "part-00001.bin fails its sha256 checksum" in caplog.text
    resumed = [e for e in events(control) if e["type"] == protocol.RESUMED]
    assert len(resumed) == 1
    data = resumed[0]["data"]
    assert data["step"] == 1 and data["uri"] == uri + "/step-000000000001"
    assert data["skipped"] == [{"uri": uri + "/step-000000000002",
                                "reason": "part-00001.bin fails its sha256 checksum"}]


def test_missing_or_truncated_objects_fall_back(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/a1"
    net, opt, sched = make_run()
    ck = Checkpointer(net, opt, sched, uri=uri, part_bytes=1024)
    for step in (1, 2, 3):
        ck.save(step)
    ck.close()
    store = Storage(uri)
    store.delete("step-000000000003/state.pkl")
    store.put("step-000000000002/part-00000.bin", store.get("step-000000000002/part-00000.bin")[:-1])
    # RESUME_FROM names the newest; both it and step 2 are unusable.
    ck2 = Checkpointer(*make_run(), uri=f"file://{tmp_path}/a2", job_uri=f"file://{tmp_path}",
                       resume_from=uri + "/step-000000000003", control_dir=tmp_path / "ctl")
    assert ck2.restore() == 1
    skipped = events(tmp_path / "ctl")[0]["data"]["skipped"]
    assert [s["reason"] for s in skipped] == ["state.pkl is missing",
                                              "part-00000.bin has 1023 bytes, the manifest says 1024"]


# --------------------------------------------------------------------------
# Killed in the middle of an upload


# A fork server: it imports torch once, then forks one trainer per request,
# so that fifty kills cost fifty forks rather than fifty interpreter starts.
_FORK_SERVER = r"""
import json, os, sys, time
import torch
from spotbroker.agent.checkpoint import Checkpointer

def trainer(spec):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    ck = Checkpointer(model, uri=spec["uri"], every_seconds=None, part_bytes=spec["part_bytes"],
                      max_workers=2, handle_signal=False)
    ck.save(1)
    with torch.no_grad():
        model.weight.add_(1.0)
    ck._uploader.before_part = lambda step, name: time.sleep(spec["part_delay"])
    ck._uploader.before_manifest = lambda step: time.sleep(5)
    print("saving", flush=True)
    ck.save(2)
    print("committed", flush=True)

for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        try:
            trainer(json.loads(line))
        finally:
            os._exit(0)
    print(f"pid {pid}", flush=True)
    os.waitpid(pid, 0)
    print("reaped", flush=True)
"""


def _read_line(stream: Any, timeout: float = 20.0) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, "the fork server went quiet"
    return stream.readline().decode().strip()


def test_killed_mid_upload_at_fifty_random_moments(s3_uri: str, tmp_path: Path) -> None:
    rng = random.Random(20261121)
    server = subprocess.Popen([sys.executable, "-c", _FORK_SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=dict(os.environ), cwd=REPO)
    assert server.stdin is not None and server.stdout is not None
    torch.manual_seed(0)
    expected = torch.nn.Linear(256, 256).state_dict()
    part_bytes = 32 * 1024  # the 257 KiB state in 9 parts, uploaded 2 at a time
    partial = 0
    try:
        for moment in range(50):
            backend = "s3" if moment % 5 == 4 else "file"
            root = f"{s3_uri}/kill-{moment}" if backend == "s3" else f"file://{tmp_path}/kill-{moment}"
            spec = {"uri": root, "part_bytes": part_bytes, "part_delay": 0.01}
            server.stdin.write((json.dumps(spec) + "\n").encode())
            server.stdin.flush()
            lines = {_read_line(server.stdout), _read_line(server.stdout)}
            pid = int(next(line for line in lines if line.startswith("pid ")).split()[1])
            assert "saving" in lines
            time.sleep(rng.uniform(0.0, 0.08))  # somewhere in the upload of step 2
            os.kill(pid, signal.SIGKILL)
            assert _read_line(server.stdout) == "reaped"

            # The previous checkpoint is still the newest committed one...
            assert [c.step for c in list_checkpoints(root)] == [1]
            store = Storage(root)
            sizes = json.loads(store.get("step-000000000001/MANIFEST.json"))["objects"]
            left = [o for o in store.list("step-000000000002")]
            partial += bool(left)
            # ...no object of the interrupted save looks whole when it is not...
            for obj in left:
                assert obj.size == sizes[obj.key.rsplit("/", 1)[1]]["size"]
            # ...and resume uses it.
            model = torch.nn.Linear(256, 256)
            assert Checkpointer(model, uri=root).restore() == 1
            assert same_state(model.state_dict(), expected)
    finally:
        server.kill()
        server.wait()
    print(f"{partial} of 50 kills left objects of the unfinished save")
    assert partial >= 10, "the kills should often land after some parts were written"


# --------------------------------------------------------------------------
# Periodic saves, flushes, options


def test_periodic_saves_every_n_steps_and_keep_last_k(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/a1"
    net, opt, sched = make_run()
    ck = Checkpointer(net, opt, sched, uri=uri, every_steps=2, every_seconds=None, keep_last=2)
    for step in range(1, 4):
        train(net, opt, sched, 1)
        ck.step(step)
        ck.wait()  # let each upload finish: this test is about which steps are kept
    mark_keep(uri + "/step-000000000002")
    for step in range(4, 11):
        train(net, opt, sched, 1)
        ck.step(step)
        ck.wait()
    ck.close()
    assert [c.step for c in list_checkpoints(uri)] == [10, 8, 2]
    assert Storage(uri).exists(f"step-000000000002/{KEEP_MARKER}")
    assert sorted(p.name for p in (tmp_path / "a1").iterdir()) == [
        "step-000000000002", "step-000000000008", "step-000000000010"]


def test_periodic_snapshots_reuse_one_host_buffer_made_ahead(tmp_path: Path) -> None:
    net, opt, sched = make_run()
    train(net, opt, sched, 1)  # the optimizer's state exists from here on
    ck = Checkpointer(net, opt, sched, uri=f"file://{tmp_path}/a1", every_steps=2, every_seconds=None)
    ck.step(1)  # nothing due: the snapshot buffer is made in the background meanwhile
    assert ck._uploader.host_preparing is not None
    ck._uploader.host_preparing.join()
    made = ck._uploader.host.tensor.data_ptr()
    for step in (2, 3, 4):
        train(net, opt, sched, 1)
        ck.step(step)
        ck.wait()
    assert ck._uploader.host.tensor.data_ptr() == made
    ck.close()
    assert [c.step for c in list_checkpoints(f"file://{tmp_path}/a1")] == [4, 2]


def test_under_an_agent_the_host_buffer_is_made_before_any_flush(tmp_path: Path) -> None:
    """With no periodic saves, the first save may be a preemption's flush: its
    window must not pay for the host buffer (for GPU state, pinned memory
    that took 5 s per 4 GiB on an H200: docs/benchmarks.md)."""
    net, opt, sched = make_run()
    train(net, opt, sched, 1)
    ck = Checkpointer(net, opt, sched, uri=f"file://{tmp_path}/a1", control_dir=tmp_path / "control",
                      every_steps=None, every_seconds=None)
    ck.step(1)  # nothing due: the buffer is made in the background
    assert ck._uploader.host_preparing is not None
    ck._uploader.host_preparing.join()
    made = ck._uploader.host.tensor.data_ptr()
    os.kill(os.getpid(), signal.SIGUSR1)
    ck.step(2)
    assert ck._uploader.host.tensor.data_ptr() == made  # the flush used it
    ck.close()
    assert [c.step for c in list_checkpoints(f"file://{tmp_path}/a1")] == [2]


def test_close_frees_the_host_buffer_and_stops_its_copy_threads(tmp_path: Path) -> None:
    net, opt, sched = make_run()
    train(net, opt, sched, 1)
    ck = Checkpointer(net, opt, sched, uri=f"file://{tmp_path}/a1", every_steps=2, every_seconds=None)
    ck.step(1)  # the buffer is made, and the copy threads started, in the background
    ck._uploader.host_preparing.join()
    ck.step(2)
    copiers = ck._uploader.host._copiers
    assert copiers is not None and ck._uploader.host.tensor is not None
    threads = list(copiers._threads)
    assert threads and all(t.is_alive() for t in threads)
    ck.close()
    assert ck._uploader.host.tensor is None and ck._uploader.host._copiers is None and ck._uploader.pool is None
    assert not any(t.is_alive() for t in threads)
    assert [c.step for c in list_checkpoints(f"file://{tmp_path}/a1")] == [2]  # the save was waited for
    ck.close()  # twice is harmless


def test_a_save_interrupted_by_the_trainers_exit_does_not_hang_close(tmp_path: Path, monkeypatch) -> None:
    """SystemExit (a trainer's own SIGTERM handler) in the middle of a save: it
    goes on up, and closing the checkpointer afterwards returns."""
    net, opt, sched = make_run()
    train(net, opt, sched, 1)
    ck = Checkpointer(net, opt, sched, uri=f"file://{tmp_path}/a1", every_steps=None, every_seconds=None)

    def interrupted(save, pipelined):
        raise SystemExit(143)

    monkeypatch.setattr(ck._uploader, "snapshot_and_submit", interrupted)
    with pytest.raises(SystemExit):
        ck.save(1)
    closing = threading.Thread(target=ck.close, daemon=True)  # a hang must not wedge the suite
    closing.start()
    closing.join(timeout=10)
    assert not closing.is_alive()


@pytest.mark.parametrize("half", [None, "bf16"])
def test_a_periodic_snapshot_holds_the_state_of_its_step_exactly(tmp_path: Path, half: str | None) -> None:
    """The snapshot copy (raw memory copies on several threads for plain CPU
    tensors, Tensor.copy_ for the rest) gives back every tensor as it was at
    the step, whatever training does to the live ones afterwards."""
    net, opt, sched = make_run()
    train(net, opt, sched, 1)
    ck = Checkpointer(net, opt, sched, uri=f"file://{tmp_path}/a1", every_steps=2, every_seconds=None,
                      part_bytes=4096, half=half)
    big = torch.arange(300_000, dtype=torch.float32)
    ck.extra.update(big=big, odd=torch.arange(12.0).reshape(3, 4).t(), empty=torch.zeros(0, 3),
                    ints=torch.arange(7, dtype=torch.int16), flags=torch.tensor([True, False, True]),
                    narrow=torch.arange(100.0)[10:77], conj=torch.tensor([1 + 2j, 3 - 4j]).conj())
    ck.step(1)
    ck._uploader.host_preparing.join()
    ck.step(2)  # the snapshot is taken here; the upload runs in the background
    expected = {k: v.clone() for k, v in net.state_dict().items()}
    big.add_(1.0)  # training goes on, changing the live tensors under the upload
    train(net, opt, sched, 1)
    assert ck.wait() is not None
    ck.close()
    net2, opt2, sched2 = make_run(seed=7)
    ck2 = Checkpointer(net2, opt2, sched2, uri=f"file://{tmp_path}/a2", job_uri=f"file://{tmp_path}")
    assert ck2.restore() == 2
    tolerance = 1e-2 if half else 0.0
    for name, value in expected.items():
        assert torch.allclose(net2.state_dict()[name].double(), value.double(), rtol=tolerance, atol=tolerance)
    assert torch.allclose(ck2.extra["big"], torch.arange(300_000, dtype=torch.float32), rtol=tolerance)
    assert torch.equal(ck2.extra["odd"], torch.arange(12.0).reshape(3, 4).t())
    assert ck2.extra["empty"].shape == (0, 3)
    assert torch.equal(ck2.extra["ints"], torch.arange(7, dtype=torch.int16))
    assert torch.equal(ck2.extra["flags"], torch.tensor([True, False, True]))
    assert torch.equal(ck2.extra["narrow"], torch.arange(100.0)[10:77])
    assert torch.equal(ck2.extra["conj"], torch.tensor([1 - 2j, 3 + 4j]))
    ck2.close()


def test_split_copies_covers_every_byte_once() -> None:
    from spotbroker.agent.checkpoint.hostbuffer import COPY_GRAIN, split_copies

    jobs = [(1000, 5000, 3 * COPY_GRAIN + 17), (10**6, 10**7, 5), (2 * 10**6, 3 * 10**7, 2 * COPY_GRAIN)]
    for ways in (1, 2, 3, 8):
        runs = split_copies(jobs, ways)
        assert 1 <= len(runs) <= ways
        pieces = [piece for run in runs for piece in run]
        assert sum(n for _, _, n in pieces) == sum(n for _, _, n in jobs)
        covered = sorted((dst, dst + n, src - dst) for dst, src, n in pieces)
        for (_, hi, _), (lo2, _, _) in itertools.pairwise(covered):
            assert hi <= lo2  # no byte copied twice
        assert {shift for _, _, shift in covered} == {src - dst for dst, src, _ in jobs}
    assert split_copies([], 2) == []


def test_every_seconds_saves_at_the_next_boundary(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/a1"
    ck = Checkpointer(*make_run(), uri=uri, every_steps=None, every_seconds=1e-9)
    ck.step(1)
    ck.wait()
    ck.step(2)
    ck.close()
    assert [c.step for c in list_checkpoints(uri)] == [2, 1]


@pytest.mark.parametrize("half", ["fp16", "bf16"])
def test_half_width_storage(tmp_path: Path, half: str) -> None:
    def wide_run(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(seed)
        net = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.Linear(128, 16))
        return net, torch.optim.Adam(net.parameters())

    net, opt = wide_run(0)
    for _ in range(3):
        opt.zero_grad()
        net(torch.randn(4, 128)).pow(2).mean().backward()
        opt.step()
    full = Checkpointer(net, opt, uri=f"file://{tmp_path}/full").save(3)
    small = Checkpointer(net, opt, uri=f"file://{tmp_path}/half", half=half).save(3)
    assert full is not None and small is not None
    assert small.bytes < 0.55 * full.bytes  # the RNG states and the pickled rest stay full size

    net2, opt2 = wide_run(3)
    assert Checkpointer(net2, opt2, uri=f"file://{tmp_path}/half").restore() == 3
    for name, value in net.state_dict().items():
        restored = net2.state_dict()[name]
        assert restored.dtype == value.dtype  # converted back on restore
        if value.is_floating_point():
            tolerance = 1e-2 if half == "bf16" else 1e-3
            assert torch.allclose(restored, value, rtol=tolerance, atol=tolerance)
        else:
            assert torch.equal(restored, value)
    # Scalars (the optimizer's step counts) keep their full width.
    assert opt2.state_dict()["state"][0]["step"].item() == 3.0


def test_flush_on_sigusr1_at_the_next_step_boundary(root_uri: str, tmp_path: Path) -> None:
    control = tmp_path / "control"
    net, opt, sched = make_run()
    ck = Checkpointer(net, opt, sched, uri=root_uri + "/a1", control_dir=control, every_seconds=None)
    assert json.loads((control / protocol.LIBRARY_FILE).read_text()) == {"pid": os.getpid(), "version": 1}
    (control / protocol.FLUSH_FILE).write_text(json.dumps({"deadline": "2026-11-21T01:00:00Z",
                                                           "reason": "preemption_notice"}))
    os.kill(os.getpid(), getattr(signal, protocol.FLUSH_SIGNAL))
    train(net, opt, sched, 1)  # the handler only set a flag: nothing is written mid-step
    assert list_checkpoints(root_uri) == []
    ck.step(7)
    # Persisted by the time step() returns.
    assert [c.step for c in list_checkpoints(root_uri)] == [7]
    committed = [e for e in events(control) if e["type"] == protocol.CHECKPOINT_COMMITTED]
    assert len(committed) == 1
    data = committed[0]["data"]
    assert data["step"] == 7 and data["reason"] == "flush"
    assert data["uri"] == root_uri + "/a1/step-000000000007"
    assert data["bytes"] > 0 and data["seconds"] >= 0
    ck.step(8)  # the request was handled once
    ck.close()
    assert len([e for e in events(control) if e["type"] == protocol.CHECKPOINT_COMMITTED]) == 1
    # Closed: the agent learns there is no library to flush any more, and a
    # late signal does not kill the process.
    assert not (control / protocol.LIBRARY_FILE).exists()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN


def test_a_flush_that_cannot_commit_says_so(tmp_path: Path) -> None:
    control = tmp_path / "control"
    ck = Checkpointer(*make_run(), uri=f"file://{tmp_path}/a1", control_dir=control, every_seconds=None)

    def store_down(step: int) -> None:
        raise ConnectionError("object store unreachable")

    ck._uploader.before_manifest = store_down
    os.kill(os.getpid(), signal.SIGUSR1)
    ck.step(3)
    ck.close()
    assert list_checkpoints(f"file://{tmp_path}/a1") == []
    reported = [(e["type"], e["data"]) for e in events(control)]
    assert reported == [(protocol.NO_FLUSH, {
        "reason": "the checkpoint of step 3 failed: ConnectionError('object store unreachable')"})]


def test_a_failing_store_never_stops_training(s3_uri: str, tmp_path: Path) -> None:
    control = tmp_path / "control"
    ck = Checkpointer(*make_run(), uri="s3://no-such-bucket/job", control_dir=control,
                      every_steps=1, every_seconds=None)
    ck.step(1)  # the periodic upload fails in the background
    assert ck.wait() is None
    ck._control.on_signal(signal.SIGUSR1, None)
    ck.step(2)  # the flush fails: reported, not raised
    ck.close()
    [event] = events(control)
    assert event["type"] == protocol.NO_FLUSH and "the checkpoint of step 2 failed" in event["data"]["reason"]


def test_without_checkpoints_the_agent_is_not_told_of_a_library(tmp_path: Path) -> None:
    ck = Checkpointer(*make_run(), control_dir=tmp_path / "control")
    assert not (tmp_path / "control" / protocol.LIBRARY_FILE).exists()
    ck.close()


def test_flush_file_alone_is_a_request(tmp_path: Path) -> None:
    """A trainer whose handler could not be installed still sees the request."""
    control = tmp_path / "control"
    ck = Checkpointer(*make_run(), uri=f"file://{tmp_path}/a1", control_dir=control,
                      every_seconds=None, handle_signal=False)
    ck.step(1)
    (control / protocol.FLUSH_FILE).write_text("{}")
    ck.step(2)
    assert [c.step for c in list_checkpoints(f"file://{tmp_path}/a1")] == [2]
    # The agent's signal for that same request, arriving after the boundary, is not a second one.
    ck._control.on_signal(signal.SIGUSR1, None)
    ck.step(3)
    ck.close()
    assert [c.step for c in list_checkpoints(f"file://{tmp_path}/a1")] == [2]


def test_a_flush_abandons_an_older_upload_in_flight(tmp_path: Path) -> None:
    control = tmp_path / "control"
    uri = f"file://{tmp_path}/a1"
    net, opt, sched = make_run()
    ck = Checkpointer(net, opt, sched, uri=uri, control_dir=control, every_steps=3, every_seconds=None,
                      part_bytes=512, max_workers=2)
    ck._uploader.before_part = lambda step, name: time.sleep(0.05) if step == 3 else None
    for step in (1, 2, 3):
        ck.step(step)  # step 3 starts a slow periodic upload in the background
    os.kill(os.getpid(), signal.SIGUSR1)
    ck.step(4)
    ck.close()
    assert [c.step for c in list_checkpoints(uri)] == [4]
    assert not (tmp_path / "a1" / "step-000000000003").exists()  # its leftovers are removed
    committed = [e["data"] for e in events(control) if e["type"] == protocol.CHECKPOINT_COMMITTED]
    assert [(d["step"], d["reason"]) for d in committed] == [(4, "flush")]


# --------------------------------------------------------------------------
# The example trainer: a flush, a kill, a resume elsewhere, the same loss


def _train_cmd(*args: str) -> list[str]:
    return [sys.executable, str(REPO / "examples" / "train.py"), "--seed", "5", "--steps", "60",
            "--log-every", "10", *args]


def _final_loss(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("final_loss="))


def _wait_for(condition: Any, timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_flush_kill_and_resume_ends_like_an_uninterrupted_run(s3_uri: str, tmp_path: Path) -> None:
    job = f"{s3_uri}/team/job-1"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBROKER_")}
    uninterrupted = subprocess.Popen(_train_cmd(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=base_env)

    control1 = tmp_path / "control-1"
    env1 = base_env | {protocol.ENV_CHECKPOINT_URI: f"{job}/attempt-1", protocol.ENV_CHECKPOINT_ROOT: job,
                       protocol.ENV_CONTROL_DIR: str(control1)}
    first = subprocess.Popen(_train_cmd("--step-seconds", "0.05", "--every-steps", "1000"),
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env1)
    try:
        assert first.stdout is not None
        # The trainer imports torch first: 20 s and more of wall time on a loaded two-core machine,
        # beside the uninterrupted run doing the same (a 30 s wait timed out there).
        _wait_for(lambda: (control1 / protocol.LIBRARY_FILE).exists(), 120, "library.json")
        pid = json.loads((control1 / protocol.LIBRARY_FILE).read_text())["pid"]
        assert pid == first.pid
        while not first.stdout.readline().startswith("step=10 "):
            pass
        (control1 / protocol.FLUSH_FILE).write_text(json.dumps({"deadline": "2026-11-21T01:00:00Z",
                                                                "reason": "preemption_notice"}))
        os.kill(pid, signal.SIGUSR1)
        commit = _wait_for(lambda: [e for e in events(control1) if e["type"] == protocol.CHECKPOINT_COMMITTED],
                           30, "checkpoint_committed")[0]["data"]
        first.kill()  # the node is reclaimed
    finally:
        first.kill()
        first.wait()
    assert commit["reason"] == "flush" and 10 <= commit["step"] < 60

    control2 = tmp_path / "control-2"
    env2 = base_env | {protocol.ENV_CHECKPOINT_URI: f"{job}/attempt-2", protocol.ENV_CHECKPOINT_ROOT: job,
                       protocol.ENV_RESUME_FROM: commit["uri"], protocol.ENV_CONTROL_DIR: str(control2)}
    second = subprocess.run(_train_cmd(), capture_output=True, text=True, env=env2, timeout=120)
    assert second.returncode == 0, second.stderr
    assert f"start_step={commit['step']}" in second.stdout
    resumed = [e["data"] for e in events(control2) if e["type"] == protocol.RESUMED]
    assert resumed == [{"step": commit["step"], "uri": commit["uri"]}]

    out, _ = uninterrupted.communicate(timeout=120)
    assert uninterrupted.returncode == 0
    assert _final_loss(second.stdout) == _final_loss(out)


def test_a_relative_control_directory_is_never_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the agent hands a control directory, always absolute: a relative one
    would put the library's files into whatever directory the trainer runs in."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(protocol.ENV_CONTROL_DIR, "agent/control-x")
    net, opt, sched = make_run()
    ck = Checkpointer(net, opt, sched, uri=(tmp_path / "ckpt").as_uri(), every_steps=1)
    ck.restore()
    ck.step(1)
    ck.close()
    assert ck.control_dir is None and not (tmp_path / "agent").exists()


# --------------------------------------------------------------------------
# What a script hands the library, and what a tampered checkpoint holds


def test_extra_is_the_very_dict_given_saved_as_it_is_and_filled_in_by_restore(tmp_path: Path) -> None:
    """`extra=` was copied: the trainer's updates to its own dict were never saved, nor
    given back (a resumed run read its data from the start, silently)."""
    uri = f"file://{tmp_path}/ckpt"
    position = {"epoch": 0, "sample": 0}
    ck = Checkpointer(*make_run(), uri=uri, every_seconds=None, extra=position)
    position.update(epoch=3, sample=3000)
    ck.save(5)
    ck.close()
    again = {"epoch": 0, "sample": 0}
    ck2 = Checkpointer(*make_run(), uri=uri, every_seconds=None, extra=again)
    taken_before = ck2.extra
    assert ck2.restore() == 5 and again == {"epoch": 3, "sample": 3000} and taken_before is again
    ck2.close()
    with pytest.raises(TypeError, match="extra must be a dict"):
        Checkpointer(*make_run(), uri=uri, extra=[("epoch", 1)])


def test_what_cannot_be_saved_or_restored_is_refused_when_the_checkpointer_is_made(tmp_path: Path) -> None:
    """A `stateful=` object without load_state_dict was saved for a whole run and failed only
    at the resume (hours of checkpoints unusable); bad knobs failed deep inside, or at the first save."""
    class Counter:
        def state_dict(self) -> dict:
            return {"n": 1}

    uri = f"file://{tmp_path}/ckpt"
    with pytest.raises(TypeError, match=r"stateful.counter \(Counter\) has no load_state_dict\(\)"):
        Checkpointer(*make_run(), uri=uri, stateful={"counter": Counter()})
    with pytest.raises(TypeError, match=r"stateful.rng \(dict\) has no state_dict\(\) or load_state_dict\(\)"):
        Checkpointer(uri=uri, stateful={"rng": {"w": 1}})
    for knobs in ({"every_steps": "10"}, {"every_steps": -5}, {"every_seconds": -1}, {"every_steps": True}):
        with pytest.raises(TypeError, match="must be a positive number or None"):
            Checkpointer(*make_run(), uri=uri, **knobs)
    ck = Checkpointer(*make_run(), uri=uri, every_seconds=None)
    with pytest.raises(TypeError, match=r"an int >= 0\), not 1.5"):
        ck.step(1.5)
    ck.step(torch.tensor(3))  # an integer of torch's (or NumPy's) is a count
    ck.close()


def test_a_step_count_that_goes_back_is_warned_of_once(tmp_path: Path, caplog) -> None:
    """Steps counted per epoch silently stopped the periodic saves until the count passed the last save."""
    ck = Checkpointer(*make_run(), uri=f"file://{tmp_path}/ckpt", every_steps=5, every_seconds=None)
    with caplog.at_level(logging.WARNING, logger="spotbroker.checkpoint"):
        for step in (*range(1, 11), *range(1, 11)):
            ck.step(step)
    ck.close()
    assert caplog.text.count("step went back from 10 to 1: give the steps done in the whole run") == 1, caplog.text


def test_a_checkpoint_of_another_model_names_the_component_and_the_checkpoint(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/ckpt"
    ck = Checkpointer(*make_run(), uri=uri, every_seconds=None)
    ck.save(3)
    ck.close()
    from spotbroker.agent.checkpoint import CheckpointMismatch

    wider = torch.nn.Linear(16, 64)
    with pytest.raises(CheckpointMismatch, match=r"step-000000000003: its model does not load into this Linear"):
        Checkpointer(wider, uri=uri, every_seconds=None).restore()


@pytest.mark.parametrize("tamper", ["entry_without_size", "entry_a_string", "step_not_the_directorys",
                                    "state_not_a_dict"])
def test_a_manifest_or_state_that_does_not_hold_up_is_skipped_for_the_previous(tmp_path: Path, tamper: str) -> None:
    """A manifest that parses but whose entries, or step, do not hold up (the one object no
    checksum covers), or a verified state of the wrong shape, crashed restore, or resumed
    at step 999 from step 40's directory: each is now unusable, and the previous one is used."""
    import hashlib
    import pickle

    uri = f"file://{tmp_path}/ckpt"
    ck = Checkpointer(*make_run(), uri=uri, every_seconds=None)
    ck.save(30)
    ck.save(40)
    ck.close()
    store = Storage(uri)
    name = "step-000000000040/MANIFEST.json"
    manifest = json.loads(store.get(name))
    if tamper == "entry_without_size":
        del manifest["objects"]["state.pkl"]["size"]
    elif tamper == "entry_a_string":
        manifest["objects"]["state.pkl"] = "abc"
    elif tamper == "step_not_the_directorys":
        manifest["step"] = 999
    else:
        data = pickle.dumps([1, 2, 3])
        store.put("step-000000000040/state.pkl", data)
        manifest["objects"]["state.pkl"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    store.put(name, json.dumps(manifest).encode())
    again = Checkpointer(*make_run(), uri=uri, every_seconds=None, control_dir=tmp_path / "ctl")
    assert again.restore() == 30
    again.close()
    (skipped,) = events(tmp_path / "ctl")[0]["data"]["skipped"]
    assert skipped["uri"].endswith("step-000000000040"), skipped


def test_under_the_agent_a_scripts_own_uri_gives_way_to_the_attempts(tmp_path: Path, monkeypatch, caplog) -> None:
    """`--checkpoint-uri` under the broker wrote where the broker neither records nor
    resumes from: every preemption trained from step 0 again."""
    mine, attempts = f"file://{tmp_path}/mine", f"file://{tmp_path}/job/a1"
    monkeypatch.setenv(protocol.ENV_CHECKPOINT_URI, attempts)
    with caplog.at_level(logging.WARNING, logger="spotbroker.checkpoint"):
        ck = Checkpointer(*make_run(), uri=mine, every_seconds=None, handle_signal=False)
    ck.save(4)
    ck.close()
    assert [c.step for c in list_checkpoints(attempts)] == [4] and not list_checkpoints(mine)
    assert f"uri={mine} is not where the broker keeps this attempt's checkpoints" in caplog.text


def test_keep_last_tells_the_agent_what_it_deleted(tmp_path: Path) -> None:
    ck = Checkpointer(*make_run(), uri=f"file://{tmp_path}/ckpt", every_steps=1, every_seconds=None,
                      keep_last=2, control_dir=tmp_path / "ctl", handle_signal=False)
    for step in range(1, 5):
        ck.step(step)
        ck.wait()
    ck.close()
    pruned = [e["data"]["steps"] for e in events(tmp_path / "ctl") if e["type"] == protocol.CHECKPOINTS_PRUNED]
    assert pruned == [[1], [2]] and [c.step for c in list_checkpoints(f"file://{tmp_path}/ckpt")] == [4, 3]
