"""Sharded state through ``torch.distributed.checkpoint`` (DCP), on our storage.

With ``Checkpointer(..., sharded=True)`` every rank writes its own shard of
the state (FSDP's, or any DTensor state dict; DCP writes a replicated
tensor once) through DCP's own planner and file layout, into the step's
prefix on any of our storages (``file://``, ``s3://``, ``gs://``,
``az://``): :class:`StorageFS` is DCP's file system over
:class:`~spotbroker.agent.checkpoint.storage.Storage`, hashing every object
as it writes it.

DCP's own writer ``torch.save``s every tensor into memory, which the storage
then writes and hashes again: three passes over the state. Ours
(:class:`RawWriter`) keeps DCP's planner, metadata and file names but writes
each rank's tensors' bytes as they are held, straight from the tensors, into
``__{rank}_{n}.raw`` objects (one per 32 MiB, up to the storage's
concurrency, written in parallel), hashing as it writes; the metadata's
``_StorageInfo`` (offset, length) locates each, and its tensor properties
(dtype) and chunk sizes give the shape back, so :class:`RawReader` reshards
as DCP's does. Objects DCP's writer made (``.distcp``, older checkpoints)
are still read its way. The commit stays ours: once DCP has written every shard and
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

from spotbroker.agent.checkpoint.format import CheckpointInvalid, byte_view, fetch_verified
from spotbroker.agent.checkpoint.storage import Storage, parallel_map

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


RAW_SUFFIX = ".raw"
BIN_BYTES = 32 * 1024 * 1024


def _raw_bytes(item: Any, data: Any, keep: list[Any]) -> memoryview:
    """The bytes of one write item as they are held (a CPU copy only for a tensor elsewhere)."""
    from torch.distributed.checkpoint.planner import WriteItemType

    if item.type == WriteItemType.BYTE_IO:
        return memoryview(data.getvalue())
    tensor = data.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.contiguous()
    keep.append(tensor)  # the view below borrows its memory
    return byte_view(tensor)


def import_dcp() -> None:
    """Import what a sharded save uses (DCP and its state-dict helpers take
    seconds to import; a flush's first save must not pay them)."""
    import torch.distributed._shard._utils  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.checkpoint.filesystem  # noqa: F401
    import torch.distributed.checkpoint.state_dict  # noqa: F401


def _bins(views: list[tuple[Any, memoryview]], most: int) -> list[list[tuple[Any, memoryview]]]:
    """The items in up to `most` objects of about equal size (at least BIN_BYTES
    each), written on as many threads: hashing and writing one rank's shard
    then uses the cores a single process's parallel parts would."""
    total = sum(view.nbytes for _, view in views)
    count = max(1, min(most, total // BIN_BYTES))
    bins: list[list[tuple[Any, memoryview]]] = [[] for _ in range(count)]
    sizes = [0] * count
    for pair in sorted(views, key=lambda pair: -pair[1].nbytes):
        smallest = sizes.index(min(sizes))
        bins[smallest].append(pair)
        sizes[smallest] += pair[1].nbytes
    return [b for b in bins if b]


def _chunk_sizes(metadata: Any, index: Any) -> Any:
    """The shape of the stored chunk that `index` (fqn, offset) names."""
    md = metadata.state_dict_metadata[index.fqn]
    chunks = md.chunks
    if index.index is not None and index.index < len(chunks) and chunks[index.index].offsets == index.offset:
        return chunks[index.index].sizes
    for chunk in chunks:
        if chunk.offsets == index.offset:
            return chunk.sizes
    raise CheckpointInvalid(f"{index.fqn}: no stored chunk at offset {list(index.offset)}")


def _writer(fs: StorageFS) -> Any:
    from torch.distributed.checkpoint import FileSystemWriter

    class RawWriter(FileSystemWriter):
        """DCP's writer with its plans and metadata, and the tensors' bytes written as held."""

        def write_data(self, plan: Any, planner: Any) -> Any:
            from torch.distributed.checkpoint.filesystem import _StorageInfo
            from torch.distributed.checkpoint.storage import WriteResult
            from torch.futures import Future

            keep: list[Any] = []
            views = [(item, _raw_bytes(item, planner.resolve_data(item), keep)) for item in plan.items]
            results: list[Any] = []

            def write(numbered: tuple[int, list[tuple[Any, memoryview]]]) -> None:
                key = f"{plan.storage_data.prefix}{numbered[0]}{RAW_SUFFIX}"
                offset = 0
                for item, view in numbered[1]:
                    results.append(WriteResult(index=item.index, size_in_bytes=view.nbytes,
                                               storage_data=_StorageInfo(key, offset, view.nbytes)))
                    offset += view.nbytes
                digest = hashlib.sha256()
                fs.storage.put(key, [view for _, view in numbered[1]], digest=digest)
                fs.written[key] = {"size": offset, "sha256": digest.hexdigest()}

            bins = _bins(views, fs.storage.max_concurrency)
            parallel_map(write, list(enumerate(bins)), len(bins))
            done: Future[list[Any]] = Future()
            done.set_result(results)
            return done

    writer = RawWriter("", sync_files=False, overwrite=True)
    writer.fs = fs
    writer.path = ""
    return writer


def _reader(fs: StorageFS) -> Any:
    import dataclasses

    import torch
    from torch.distributed._shard._utils import narrow_tensor_by_index
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.planner import LoadItemType

    class RawReader(FileSystemReader):
        """Reads ``.raw`` objects without ``torch.load``; anything else as DCP's reader does."""

        def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
            super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
            self.metadata = metadata

        def read_data(self, plan: Any, planner: Any) -> Any:
            per_object: dict[str, list[Any]] = {}
            others = []
            for req in plan.items:
                path = self.storage_data[req.storage_index].relative_path
                if path.endswith(RAW_SUFFIX):
                    per_object.setdefault(path, []).append(req)
                else:
                    others.append(req)
            for path, reqs in per_object.items():
                data = memoryview(fetch_verified(fs.storage, path, fs.verify or {}))
                for req in reqs:
                    info = self.storage_data[req.storage_index]
                    raw = data[info.offset:info.offset + info.length]
                    if req.type == LoadItemType.BYTE_IO:
                        planner.load_bytes(req, io.BytesIO(raw.tobytes()))
                        continue
                    dtype = self.metadata.state_dict_metadata[req.storage_index.fqn].properties.dtype
                    sizes = _chunk_sizes(self.metadata, req.storage_index)
                    stored = (torch.frombuffer(raw, dtype=dtype) if info.length
                              else torch.empty(0, dtype=dtype)).view(sizes)
                    target = planner.resolve_tensor(req).detach()
                    target.copy_(narrow_tensor_by_index(stored, req.storage_offsets, req.lengths))
                    planner.commit_tensor(req, target)
            return super().read_data(dataclasses.replace(plan, items=others), planner)

    reader = RawReader("")
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


def sharded_state(parts: dict[str, Any]) -> dict[str, Any]:
    """A Checkpointer's components as DCP saves them: model and optimizer keyed
    by parameter name, sharded as held; the others by their state_dict."""
    state = model_and_optimizer_state(parts["model"], parts.get("optimizer")) if "model" in parts else {}
    for name, obj in parts.items():
        if name not in ("model", "optimizer"):
            state[name] = obj.state_dict()
    return state


def apply_sharded(parts: dict[str, Any], state: dict[str, Any]) -> None:
    if "model" in parts:
        set_model_and_optimizer_state(parts["model"], parts.get("optimizer"), state)
    for name, obj in parts.items():
        if name not in ("model", "optimizer"):
            obj.load_state_dict(state[name])


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
