"""Sharded state through ``torch.distributed.checkpoint`` (DCP), on our storage.

With ``Checkpointer(..., sharded=True)`` every rank writes its own shard of
the state (FSDP's, or any DTensor state dict; DCP writes a replicated
tensor once) through DCP's own planner and file layout, into the step's
prefix on any of our storages (``file://``, ``s3://``, ``gs://``,
``az://``): :class:`StorageFS` is DCP's file system over
:class:`~spotbroker.agent.checkpoint.storage.Storage`, hashing every object
as it writes it. The commit stays ours: once DCP has written every shard and
its ``.metadata``, the ranks hand their objects' sizes and sha256 to rank 0,
which checks that each is there at its size and only then writes
``MANIFEST.json`` (``"layout": "sharded"``). Reading back, every object a
rank reads is fetched whole and checked against the manifest first. DCP
reshards on load, so a sharded checkpoint restores on another world size
where the state's own layout allows it (DTensor / FSDP state).
"""
from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from spotbroker.agent.checkpoint.format import CheckpointInvalid, fetch_verified
from spotbroker.agent.checkpoint.storage import Storage

LAYOUT = "sharded"


class _HashingSink(io.RawIOBase):
    """A write-only stream that keeps what is written (to put it whole) and hashes it."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[bytes] = []
        self.size = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:  # DCP records where each item starts
        return self.size

    def write(self, b: Any) -> int:
        data = bytes(b)  # the writer may reuse its buffer
        self.chunks.append(data)
        self.size += len(data)
        return len(data)


class StorageFS:
    """DCP's ``FileSystemBase`` over a step's prefix; ``written`` holds
    ``{name: {"size", "sha256"}}`` of what this process wrote."""

    def __init__(self, storage: Storage, verify: dict[str, dict[str, Any]] | None = None) -> None:
        self.storage = storage
        self.verify = verify  # reading: the manifest's objects
        self.written: dict[str, dict[str, Any]] = {}
        self._held: dict[str, bytes] = {}  # the small objects DCP renames (its .metadata)

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        key = os.fspath(path)
        if "r" in mode:
            if self.verify is None:
                raise CheckpointInvalid("reading a sharded checkpoint without its manifest")
            yield io.BytesIO(bytes(fetch_verified(self.storage, key, self.verify)))
            return
        sink = _HashingSink()
        yield sink
        digest = hashlib.sha256()
        self.storage.put(key, sink.chunks, digest=digest)
        self.written[key] = {"size": sink.size, "sha256": digest.hexdigest()}
        if key.endswith(".tmp"):
            self._held[key] = b"".join(sink.chunks)

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> str:
        path = os.fspath(path)
        return f"{path}/{suffix}" if path else suffix

    def init_path(self, path: str | os.PathLike[str], **kwargs: Any) -> str:
        return os.fspath(path)

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        old, new = os.fspath(path), os.fspath(new_path)
        data = self._held.pop(old, None)
        if data is None:
            data = self.storage.get(old)
        self.storage.put(new, data)
        self.written[new] = self.written.pop(old, {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        self.storage.delete(old)

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        pass  # prefixes need no making

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return True

    def exists(self, path: str | os.PathLike[str]) -> bool:
        return self.storage.exists(os.fspath(path))

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        self.storage.delete(os.fspath(path))
        self.written.pop(os.fspath(path), None)

    def ls(self, path: str | os.PathLike[str]) -> list[str]:
        return [o.key for o in self.storage.iter(os.fspath(path))]


def _writer(fs: StorageFS) -> Any:
    from torch.distributed.checkpoint import FileSystemWriter

    writer = FileSystemWriter("", sync_files=False, overwrite=True)
    writer.fs = fs
    writer.path = ""
    return writer


def _reader(fs: StorageFS) -> Any:
    from torch.distributed.checkpoint import FileSystemReader

    reader = FileSystemReader("")
    reader.fs = fs
    reader.path = ""
    return reader


def save_shards(storage: Storage, state: dict[str, Any], group: Any) -> dict[str, dict[str, Any]]:
    """Write this rank's part of ``state`` (a collective with every rank of
    ``group``); the objects this rank wrote."""
    import torch.distributed.checkpoint as dcp

    fs = StorageFS(storage)
    dcp.save(state, storage_writer=_writer(fs), process_group=group, no_dist=group is None)
    return fs.written


def load_shards(storage: Storage, objects: dict[str, dict[str, Any]], state: dict[str, Any], group: Any) -> None:
    """Load ``state`` in place from the checkpoint at ``storage`` (a collective)."""
    import torch.distributed.checkpoint as dcp

    dcp.load(state, storage_reader=_reader(StorageFS(storage, verify=objects)), process_group=group,
             no_dist=group is None)


def model_and_optimizer_state(model: Any, optimizer: Any) -> dict[str, Any]:
    """The model's and optimizer's state as DCP keys them (by parameter name,
    sharded as they are held: FSDP, DDP or a plain module)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    if optimizer is None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return {"model": get_model_state_dict(model)}
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optim_state}


def set_model_and_optimizer_state(model: Any, optimizer: Any, state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    if optimizer is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
