"""The on-storage format of one checkpoint, and reading it back verified.

A checkpoint of step N is the prefix ``step-{N:012d}/``: the tensors' bytes as
one stream cut into equal parts (``part-00000.bin``...), ``index.json`` (the
:class:`Layout`: where each tensor lies in the stream and how it is stored),
``state.pkl`` (the skeleton, see :mod:`spotbroker.agent.checkpoint.state`) and,
written last, ``MANIFEST.json`` with the size and sha256 of every object. A
checkpoint without its manifest does not exist; one whose objects do not
match their manifest entries is :class:`CheckpointInvalid`.
"""
from __future__ import annotations

import bisect
import ctypes
import hashlib
import json
import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from spotbroker.agent import protocol
from spotbroker.agent.checkpoint.state import import_torch, unflatten
from spotbroker.agent.checkpoint.storage import Storage, parallel_map

FORMAT = "spotbroker-checkpoint/1"
INDEX_OBJECT = "index.json"
STATE_OBJECT = "state.pkl"
# An object of this name in a step's prefix means: never delete this checkpoint.
KEEP_MARKER = "KEEP"
# Tensor offsets in the byte stream are aligned so that any dtype can be
# viewed in place (and so that copies run on aligned memory).
ALIGN = 64

HalfMode = Literal["fp16", "bf16"]

@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint."""

    step: int
    uri: str
    bytes: int
    created_at: datetime | None = None
    seconds: float | None = None
    reason: str | None = None


class CheckpointInvalid(Exception):
    """A checkpoint that cannot be used: no manifest, a missing or corrupt object."""


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Slot:
    """Where one tensor lies in the byte stream, and how it was stored."""

    dtype: str          # the tensor's dtype
    stored: str         # the dtype of the stored bytes (half width when asked)
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Layout:
    slots: tuple[Slot, ...]
    total: int
    part_bytes: int

    def parts(self) -> list[tuple[int, int]]:
        """Byte ranges of the parts: equal slices of the stream (a tensor may span two)."""
        return [(s, min(s + self.part_bytes, self.total)) for s in range(0, self.total, self.part_bytes)]

    def to_json(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "part_bytes": self.part_bytes,
            "tensors": [[s.dtype, s.stored, list(s.shape), s.offset, s.nbytes] for s in self.slots],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Layout:
        slots = tuple(Slot(d, st, tuple(sh), off, n) for d, st, sh, off, n in doc["tensors"])
        return cls(slots=slots, total=int(doc["total"]), part_bytes=int(doc["part_bytes"]))


def part_name(index: int) -> str:
    return f"part-{index:05d}.bin"


def stored_dtype(t: Any, half: HalfMode | None) -> Any:
    torch = import_torch()
    if half and t.dtype in (torch.float32, torch.float64) and t.dim() > 0:
        return torch.float16 if half == "fp16" else torch.bfloat16
    return t.dtype


def plan(tensors: list[Any], half: HalfMode | None, part_bytes: int) -> Layout:
    slots = []
    offset = 0
    for t in tensors:
        stored = stored_dtype(t, half)
        nbytes = t.numel() * stored.itemsize
        slots.append(Slot(dtype_name(t.dtype), dtype_name(stored), tuple(t.shape), offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    total = slots[-1].offset + slots[-1].nbytes if slots else 0
    return Layout(slots=tuple(slots), total=total, part_bytes=part_bytes)


def byte_view(t: Any) -> memoryview:
    """A writable memoryview over a contiguous CPU tensor's bytes (no numpy needed).
    The caller keeps ``t`` alive for as long as the view is used."""
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(bytearray())
    return memoryview((ctypes.c_ubyte * n).from_address(t.data_ptr())).cast("B")


def slot_view(buffer: Any, slot: Slot) -> Any:
    """The tensor-shaped view of ``slot`` inside a uint8 host buffer."""
    return typed(buffer[slot.offset:slot.offset + slot.nbytes], slot)


def typed(raw: Any, slot: Slot) -> Any:
    """A uint8 tensor of ``slot.nbytes`` seen as the stored dtype and shape."""
    return raw.view(getattr(import_torch(), slot.stored)).view(slot.shape)


# --- reading a checkpoint back -----------------------------------------------


def read_manifest(storage: Storage) -> dict[str, Any]:
    """The checkpoint's manifest, its step an int; CheckpointInvalid if none,
    unreadable, or not of its directory's step (the manifest is the one
    object no checksum covers: `"step": 999` in step 40's resumed at 999)."""
    try:
        manifest = json.loads(storage.get(protocol.MANIFEST))
        manifest["step"] = int(manifest["step"])
        if not isinstance(manifest["objects"], dict):
            raise TypeError("objects is not a mapping")
        for name, entry in manifest["objects"].items():
            if not (isinstance(entry, dict) and type(entry.get("size")) is int and entry["size"] >= 0
                    and isinstance(entry.get("sha256"), str) and re.fullmatch(r"[0-9a-f]{64}", entry["sha256"])):
                raise ValueError(f"its entry for {name!r} is not a size and a sha256")
    except FileNotFoundError as exc:
        raise CheckpointInvalid("no manifest (never committed)") from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointInvalid(f"unreadable manifest: {exc}") from exc
    named = re.search(r"step-(\d{12})$", storage.url("").rstrip("/"))
    if named and int(named.group(1)) != manifest["step"]:
        raise CheckpointInvalid(f"its manifest says step {manifest['step']}, its directory {int(named.group(1))}")
    return manifest


def load_checkpoint(storage: Storage, workers: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read and verify the checkpoint rooted at ``storage``: (state, manifest).

    Raises CheckpointInvalid when the manifest or any object is missing, of
    the wrong size or fails its sha256.
    """
    manifest = read_manifest(storage)
    if manifest.get("layout", "stream") != "stream":
        raise CheckpointInvalid(f"written {manifest['layout']} by {manifest.get('world_size', '?')} ranks "
                                "(torch.distributed.checkpoint): restore it with Checkpointer(sharded=True)")
    objects: dict[str, dict[str, Any]] = manifest["objects"]
    index_bytes = fetch_verified(storage, INDEX_OBJECT, objects)
    state_bytes = fetch_verified(storage, STATE_OBJECT, objects)
    try:
        index = json.loads(index_bytes)
        layout = Layout.from_json(index)
        skeleton = pickle.loads(state_bytes)
    except Exception as exc:  # verified bytes that do not parse: a writer bug, still unusable
        raise CheckpointInvalid(f"unreadable index or state: {exc}") from exc
    if not (isinstance(skeleton, dict) and isinstance(skeleton.get("components", {}), dict)
            and skeleton.get("step", manifest["step"]) == manifest["step"]):
        raise CheckpointInvalid("its state is not a checkpoint's state of this step")

    torch = import_torch()
    raw = [torch.empty(slot.nbytes, dtype=torch.uint8) for slot in layout.slots]
    starts = [slot.offset for slot in layout.slots]

    def read_part(numbered: tuple[int, tuple[int, int]]) -> None:
        number, (begin, end) = numbered
        data = fetch_verified(storage, part_name(number), objects, expected_size=end - begin)
        source = torch.frombuffer(data, dtype=torch.uint8)
        # Scatter the part into the tensors it overlaps.
        i = max(bisect.bisect_right(starts, begin) - 1, 0)
        while i < len(layout.slots) and layout.slots[i].offset < end:
            slot = layout.slots[i]
            lo, hi = max(begin, slot.offset), min(end, slot.offset + slot.nbytes)
            if lo < hi:
                raw[i][lo - slot.offset:hi - slot.offset].copy_(source[lo - begin:hi - begin])
            i += 1

    parallel_map(read_part, list(enumerate(layout.parts())), workers)
    tensors = []
    for slot, data in zip(layout.slots, raw):
        t = typed(data, slot)
        if slot.stored != slot.dtype:
            t = t.to(getattr(torch, slot.dtype))
        tensors.append(t)
    return unflatten(skeleton, tensors), manifest


def fetch_verified(storage: Storage, name: str, objects: Mapping[str, Mapping[str, Any]],
                    expected_size: int | None = None) -> bytearray:
    """The bytes of one object, checked against its manifest entry."""
    entry = objects.get(name)
    if entry is None:
        raise CheckpointInvalid(f"{name} is not in the manifest")
    size = int(entry["size"])
    if expected_size is not None and size != expected_size:
        raise CheckpointInvalid(f"{name}: manifest says {size} bytes, the index {expected_size}")
    info = storage.head(name)
    if info is None:
        raise CheckpointInvalid(f"{name} is missing")
    if info.size != size:
        raise CheckpointInvalid(f"{name} has {info.size} bytes, the manifest says {size}")
    data = bytearray(size)
    try:
        storage.get_into(name, data)
    except (FileNotFoundError, EOFError) as exc:
        raise CheckpointInvalid(f"{name} could not be read whole: {exc}") from exc
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise CheckpointInvalid(f"{name} fails its sha256 checksum")
    return data
