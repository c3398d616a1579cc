"""Sharded saves (``torch.distributed.checkpoint`` on our storage): the
tensors' bytes go to storage as they are held, DCP's metadata locates them,
and what older versions wrote (DCP's own ``torch.save`` objects) still loads."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the sharded layout needs torch (CPU torch is installed for tests)")

from spotbroker.agent.checkpoint.sharded import StorageFS, load_shards, save_shards  # noqa: E402
from spotbroker.agent.checkpoint.storage import Storage  # noqa: E402


def state() -> dict:
    g = torch.Generator().manual_seed(7)
    return {"model": {"w": torch.randn(33, 17, generator=g), "half": torch.randn(5, generator=g).bfloat16(),
                      "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 4),
                      "strided": torch.randn(8, 6, generator=g).t()},
            "optimizer": {"step": torch.tensor(12, dtype=torch.int64), "lr": 0.003, "name": "adamw"}}


def zeroed(like: dict) -> dict:
    return {k: zeroed(v) if isinstance(v, dict) else torch.zeros_like(v) if isinstance(v, torch.Tensor) else None
            for k, v in like.items()}


def assert_same(got: dict, want: dict) -> None:
    for key, value in want.items():
        if isinstance(value, dict):
            assert_same(got[key], value)
        elif isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
        else:
            assert got[key] == value, key


def test_tensors_are_stored_as_raw_bytes_and_load_back(tmp_path: Path) -> None:
    storage = Storage(f"file://{tmp_path}/ckpt")
    saved = state()
    objects = save_shards(storage, saved, None)
    assert [n for n in objects if n.endswith(".raw")] == ["__0_0.raw"] and ".metadata" in objects
    assert not [n for n in objects if n.endswith(".distcp")]
    w = saved["model"]["w"]
    raw = storage.get("__0_0.raw")
    assert bytes(w.numpy().tobytes()) in raw  # the tensor's own bytes, no pickle around them
    loaded = zeroed(saved)
    load_shards(storage, objects, loaded, None)
    assert_same(loaded, saved)


def test_a_flipped_byte_in_a_shard_is_refused(tmp_path: Path) -> None:
    storage = Storage(f"file://{tmp_path}/ckpt")
    objects = save_shards(storage, state(), None)
    path = tmp_path / "ckpt" / "__0_0.raw"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    # DCP wraps what a reader raises in its CheckpointException (a BaseException); the
    # library's restore turns that into a fallback to the previous checkpoint.
    with pytest.raises(BaseException, match="__0_0.raw fails its sha256 checksum"):
        load_shards(storage, objects, zeroed(state()), None)


def test_a_checkpoint_written_by_dcps_own_writer_still_loads(tmp_path: Path) -> None:
    """The layout before raw shards: every tensor torch.save'd by DCP's FileSystemWriter."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    storage = Storage(f"file://{tmp_path}/ckpt")
    fs = StorageFS(storage)
    writer = FileSystemWriter("", sync_files=False, overwrite=True)
    writer.fs, writer.path = fs, ""
    saved = state()
    dcp.save(saved, storage_writer=writer, no_dist=True)
    assert [n for n in fs.written if n.endswith(".distcp")]
    loaded = zeroed(saved)
    load_shards(storage, fs.written, loaded, None)
    assert_same(loaded, saved)


RESHARD = r"""
import json, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from spotbroker.agent.checkpoint.sharded import save_shards
from spotbroker.agent.checkpoint.storage import Storage
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
full = torch.arange(10 * 6, dtype=torch.float32).reshape(10, 6)
written = save_shards(Storage(sys.argv[1]), {"w": distribute_tensor(full, mesh, [Shard(0)])}, dist.group.WORLD)
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, written)
if dist.get_rank() == 0:
    print(json.dumps({k: v for part in everyone for k, v in part.items()}))
dist.destroy_process_group()
"""


def test_shards_of_two_ranks_load_whole_in_one_process(tmp_path: Path) -> None:
    """Resharding: a tensor sharded over two ranks restores on a world of one."""
    import json

    script = tmp_path / "reshard.py"
    script.write_text(RESHARD)
    uri = f"file://{tmp_path}/ckpt"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), uri], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    objects = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"__0_0.raw", "__1_0.raw"} <= set(objects)
    loaded = {"w": torch.zeros(10, 6)}
    load_shards(Storage(uri), objects, loaded, None)
    assert torch.equal(loaded["w"], torch.arange(10 * 6, dtype=torch.float32).reshape(10, 6))
