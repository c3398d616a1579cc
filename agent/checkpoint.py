"""Preemption-safe checkpoints for a PyTorch training loop, in two lines.

::

    from spotbroker.agent.checkpoint import Checkpointer

    ckpt = Checkpointer(model, optimizer, scheduler, every_steps=100, every_seconds=600)
    for step in range(ckpt.restore(), total_steps):   # 0, or the steps already done
        train_one_step(step)
        ckpt.step(step + 1)                             # a step boundary: steps done so far
    ckpt.close()                                        # waits for the last upload

Under the spotbroker agent everything else comes from the environment
(``CHECKPOINT_URI``, ``RESUME_FROM``, ``SPOTBROKER_CHECKPOINT_JOB_URI``,
``SPOTBROKER_CONTROL_DIR``, see :mod:`spotbroker.agent.protocol`). Without an
agent pass ``uri="file:///some/dir"`` (or ``s3://``, ``gs://``, ``az://``).

What it does

* **Layout and commit rule.** A checkpoint of step N is the prefix
  ``{uri}/step-{N:012d}/``: the tensor bytes in parts (``part-00000.bin``…),
  ``index.json`` (where each tensor lies), ``state.pkl`` (everything that is not
  a tensor) and, written **last**, ``MANIFEST.json`` with the size and sha256
  of every object. A checkpoint without its manifest does not exist.
* **Periodic saves** (every ``every_steps`` steps or ``every_seconds``
  seconds, whichever comes first) are two-phase: :meth:`Checkpointer.step`
  copies the state into one host buffer (the only stall; the buffer is reused
  from save to save), and a background thread hashes and uploads the parts in
  parallel while training goes on. If the previous upload is still running
  when the next save is due, that save is put off to the next boundary.
* **Flush on request.** The agent writes ``flush.json`` and sends ``SIGUSR1``
  when a preemption notice comes; the handler only sets a flag, and the next
  :meth:`Checkpointer.step` persists the current state at once and returns
  when it is committed (CPU tensors are uploaded in place, with no copy; GPU
  ones part by part as they reach host memory), then appends
  ``checkpoint_committed`` to ``events.jsonl``. An older upload still in
  flight is abandoned first. If the window closes before the manifest is
  written, the newest committed periodic checkpoint still stands. A save that
  fails is logged (a flush also reports ``no_flush``); it never raises into
  the training loop. :meth:`Checkpointer.close` withdraws ``library.json``.
* **Restore** tries ``RESUME_FROM`` when set, otherwise the newest step across
  all attempts of the job (or under ``uri``), verifying every object against
  the manifest; a checkpoint with a missing, truncated or corrupt object is
  skipped with a warning, and the previous one is tried. ``resumed`` is
  appended to ``events.jsonl`` (with the skipped ones, if any).
* **State**: model, optimizer, scheduler and any other object with
  ``state_dict``/``load_state_dict`` (``stateful=``), the RNG states (Python,
  NumPy if imported, torch CPU and CUDA) and ``ckpt.extra``, a dict of your
  own (data position, best metric...) saved with each checkpoint and given
  back by :meth:`Checkpointer.restore`.
* **Options**: ``keep_last=K`` deletes this attempt's older checkpoints after
  each commit, never one holding a ``KEEP`` marker object (the broker marks the
  gold weights that way) nor other attempts' ones. ``half="bf16"`` or
  ``"fp16"`` stores floating tensors of one or more dimensions at half width:
  half the bytes and upload time, at a price: the restored weights and
  optimizer moments are rounded, so a resumed run no longer matches an
  uninterrupted one bit for bit, and fp16 saturates beyond ±65504 (Adam's
  second moments can overflow or underflow) where bf16 keeps float32's range
  with fewer mantissa bits. Scalars (such as optimizer step counts) are always
  kept at full width. Off by default.

torch is imported lazily: it is the user's own (>= 2.1), never a dependency.
``state.pkl`` is a pickle, like ``torch.load(weights_only=False)``: restore only
from storage you trust (the sha256 check guards against corruption, not
against an attacker who can write the manifest too).
"""
from __future__ import annotations

import bisect
import ctypes
import hashlib
import json
import logging
import os
import pickle
import random
import re
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from spotbroker.agent import protocol
from spotbroker.agent.storage import Storage, parallel_map

log = logging.getLogger("spotbroker.checkpoint")

FORMAT = "spotbroker-checkpoint/1"
INDEX_OBJECT = "index.json"
STATE_OBJECT = "state.pkl"
# An object of this name in a step's prefix means: never delete this checkpoint.
KEEP_MARKER = "KEEP"
DEFAULT_PART_BYTES = 16 * 1024 * 1024
DEFAULT_WORKERS = 8
# Tensor offsets in the byte stream are aligned so that any dtype can be
# viewed in place (and so that copies run on aligned memory).
_ALIGN = 64
_STEP_MANIFEST_RE = re.compile(r"(?:^|/)step-(\d{12})/" + re.escape(protocol.MANIFEST) + r"$")

HalfMode = Literal["fp16", "bf16"]


def _torch() -> Any:
    import torch  # the user's own; imported only when a checkpoint is made or read

    return torch


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


# --------------------------------------------------------------------------
# Public records and helpers


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


def list_checkpoints(uri: str) -> list[CheckpointInfo]:
    """Committed checkpoints anywhere under ``uri`` (a job or attempt prefix), newest first.

    Committed means the manifest exists; the objects are not verified here
    (:meth:`Checkpointer.restore` does that). ``bytes`` sums the step's objects.
    """
    storage = Storage(uri)
    sizes: dict[str, int] = {}
    manifests: dict[str, tuple[int, datetime | None]] = {}
    for obj in storage.iter():
        directory, _, name = obj.key.rpartition("/")
        sizes[directory] = sizes.get(directory, 0) + obj.size
        match = _STEP_MANIFEST_RE.search(obj.key)
        if match:
            manifests[directory] = (int(match.group(1)), obj.last_modified)
    found = [
        CheckpointInfo(step=step, uri=storage.url(directory), bytes=sizes[directory], created_at=created)
        for directory, (step, created) in manifests.items()
    ]
    oldest = datetime.min.replace(tzinfo=timezone.utc)
    found.sort(key=lambda c: (c.step, c.created_at or oldest), reverse=True)
    return found


def mark_keep(checkpoint_uri: str) -> None:
    """Mark a checkpoint (its ``.../step-N`` URI) so that ``keep_last`` never deletes it."""
    Storage(checkpoint_uri).put(KEEP_MARKER, b"")


# --------------------------------------------------------------------------
# The state as a small pickled skeleton plus one stream of raw tensor bytes


class _TensorRef:
    """Stands in the pickled skeleton for the tensor at ``index`` in the stream."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return (_TensorRef, (self.index,))


def _streamable(t: Any) -> bool:
    """Plain dense tensors go to the byte stream; exotic ones (sparse,
    quantized, subclasses such as DTensor) are left to pickle."""
    torch = _torch()
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided
            and not t.is_quantized and t.device.type != "meta")


def _flatten(obj: Any, tensors: list[Any]) -> Any:
    """Replace every streamable tensor in nested dicts/lists/tuples by a _TensorRef."""
    torch = _torch()
    if isinstance(obj, torch.Tensor):
        if not _streamable(obj):
            return obj
        tensors.append(obj.detach())
        return _TensorRef(len(tensors) - 1)
    if type(obj) in (dict, OrderedDict):
        return _same_mapping(obj, ((k, _flatten(v, tensors)) for k, v in obj.items()))
    if type(obj) is list:
        return [_flatten(v, tensors) for v in obj]
    if type(obj) is tuple:
        return tuple(_flatten(v, tensors) for v in obj)
    return obj


def _unflatten(obj: Any, tensors: list[Any]) -> Any:
    if isinstance(obj, _TensorRef):
        return tensors[obj.index]
    if type(obj) in (dict, OrderedDict):
        return _same_mapping(obj, ((k, _unflatten(v, tensors)) for k, v in obj.items()))
    if type(obj) is list:
        return [_unflatten(v, tensors) for v in obj]
    if type(obj) is tuple:
        return tuple(_unflatten(v, tensors) for v in obj)
    return obj


def _same_mapping(original: Any, items: Any) -> Any:
    """A mapping of the original's type; a module's state_dict keeps its
    ``_metadata`` (the module versions load_state_dict reads)."""
    mapping = type(original)(items)
    metadata = getattr(original, "_metadata", None)
    if metadata is not None:
        mapping._metadata = metadata
    return mapping


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class _Slot:
    """Where one tensor lies in the byte stream, and how it was stored."""

    dtype: str          # the tensor's dtype
    stored: str         # the dtype of the stored bytes (half width when asked)
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class _Layout:
    slots: tuple[_Slot, ...]
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
    def from_json(cls, doc: Mapping[str, Any]) -> _Layout:
        slots = tuple(_Slot(d, st, tuple(sh), off, n) for d, st, sh, off, n in doc["tensors"])
        return cls(slots=slots, total=int(doc["total"]), part_bytes=int(doc["part_bytes"]))


def _part_name(index: int) -> str:
    return f"part-{index:05d}.bin"


def _stored_dtype(t: Any, half: HalfMode | None) -> Any:
    torch = _torch()
    if half and t.dtype in (torch.float32, torch.float64) and t.dim() > 0:
        return torch.float16 if half == "fp16" else torch.bfloat16
    return t.dtype


def _plan(tensors: list[Any], half: HalfMode | None, part_bytes: int) -> _Layout:
    slots = []
    offset = 0
    for t in tensors:
        stored = _stored_dtype(t, half)
        nbytes = t.numel() * stored.itemsize
        slots.append(_Slot(_dtype_name(t.dtype), _dtype_name(stored), tuple(t.shape), offset, nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    total = slots[-1].offset + slots[-1].nbytes if slots else 0
    return _Layout(slots=tuple(slots), total=total, part_bytes=part_bytes)


def _byte_view(t: Any) -> memoryview:
    """A writable memoryview over a contiguous CPU tensor's bytes (no numpy needed).
    The caller keeps ``t`` alive for as long as the view is used."""
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(bytearray())
    return memoryview((ctypes.c_ubyte * n).from_address(t.data_ptr())).cast("B")


def _slot_view(buffer: Any, slot: _Slot) -> Any:
    """The tensor-shaped view of ``slot`` inside a uint8 host buffer."""
    return _typed(buffer[slot.offset:slot.offset + slot.nbytes], slot)


def _typed(raw: Any, slot: _Slot) -> Any:
    """A uint8 tensor of ``slot.nbytes`` seen as the stored dtype and shape."""
    return raw.view(getattr(_torch(), slot.stored)).view(slot.shape)


class _BufferSource:
    """Part bytes from a snapshot in the host buffer: one slice per part."""

    def __init__(self, view: memoryview) -> None:
        self.view = view

    def segments(self, begin: int, end: int) -> list[memoryview]:
        return [self.view[begin:end]]


_PADDING = memoryview(bytes(_ALIGN))


class _TensorSource:
    """Part bytes straight from the live CPU tensors, with no copy at all.

    Only for saves the caller waits for (a flush): the tensors must not
    change until the upload is done.
    """

    def __init__(self, tensors: list[Any], layout: _Layout) -> None:
        self.tensors = [t.contiguous() for t in tensors]  # a no-op for contiguous ones
        self.views = [_byte_view(t) for t in self.tensors]
        self.slots = layout.slots
        self.starts = [slot.offset for slot in layout.slots]

    def segments(self, begin: int, end: int) -> list[memoryview]:
        out: list[memoryview] = []
        position = begin
        i = max(bisect.bisect_right(self.starts, begin) - 1, 0)
        while position < end:
            slot = self.slots[i]
            if position < slot.offset:  # alignment padding before this tensor
                gap = min(slot.offset, end) - position
                out.append(_PADDING[:gap])
                position += gap
                continue
            stop = min(end, slot.offset + slot.nbytes)
            if position < stop:
                out.append(self.views[i][position - slot.offset:stop - slot.offset])
                position = stop
            i += 1
        return out


class _HostBuffer:
    """One pinned-if-useful uint8 buffer holding a snapshot; reused while the layout holds."""

    def __init__(self) -> None:
        self.layout: _Layout | None = None
        self.tensor: Any = None
        self.view = memoryview(bytearray())

    def ensure(self, layout: _Layout, pin: bool) -> None:
        if self.layout is not None and self.layout.slots == layout.slots and self.tensor is not None:
            self.layout = layout
            return
        torch = _torch()
        self.tensor = None  # let the old one go before allocating the new one
        # zeros, not empty: the alignment padding then hashes the same every time.
        self.tensor = torch.zeros(max(layout.total, 1), dtype=torch.uint8, pin_memory=pin)
        self.view = _byte_view(self.tensor)[:layout.total]
        self.layout = layout


# --------------------------------------------------------------------------
# Loading


def _load(storage: Storage, workers: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read and verify the checkpoint rooted at ``storage``: (state, manifest).

    Raises CheckpointInvalid when the manifest or any object is missing, of
    the wrong size or fails its sha256.
    """
    try:
        manifest = json.loads(storage.get(protocol.MANIFEST))
        objects: dict[str, dict[str, Any]] = manifest["objects"]
        manifest["step"] = int(manifest["step"])
    except FileNotFoundError as exc:
        raise CheckpointInvalid("no manifest (never committed)") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointInvalid(f"unreadable manifest: {exc}") from exc
    index_bytes = _fetch_verified(storage, INDEX_OBJECT, objects)
    state_bytes = _fetch_verified(storage, STATE_OBJECT, objects)
    try:
        index = json.loads(index_bytes)
        layout = _Layout.from_json(index)
        skeleton = pickle.loads(state_bytes)
    except Exception as exc:  # verified bytes that do not parse: a writer bug, still unusable
        raise CheckpointInvalid(f"unreadable index or state: {exc}") from exc

    torch = _torch()
    raw = [torch.empty(slot.nbytes, dtype=torch.uint8) for slot in layout.slots]
    starts = [slot.offset for slot in layout.slots]

    def read_part(numbered: tuple[int, tuple[int, int]]) -> None:
        number, (begin, end) = numbered
        data = _fetch_verified(storage, _part_name(number), objects, expected_size=end - begin)
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
        t = _typed(data, slot)
        if slot.stored != slot.dtype:
            t = t.to(getattr(torch, slot.dtype))
        tensors.append(t)
    return _unflatten(skeleton, tensors), manifest


def _fetch_verified(storage: Storage, name: str, objects: Mapping[str, Mapping[str, Any]],
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


# --------------------------------------------------------------------------
# One save in progress


class _Cancelled(Exception):
    pass


@dataclass
class _Save:
    step: int
    reason: str
    directory: str                       # the step's prefix, relative to the storage root
    started: float                       # time.monotonic() at the step boundary
    futures: list[Future[tuple[str, int, str]]] = field(default_factory=list)
    source: _BufferSource | _TensorSource | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    parts_done: threading.Event = field(default_factory=threading.Event)  # host buffer free again
    done: threading.Event = field(default_factory=threading.Event)
    result: CheckpointInfo | None = None
    error: BaseException | None = None


# --------------------------------------------------------------------------
# The user-facing object


class Checkpointer:
    """Saves and restores a training loop's state; see the module's docstring.

    ``model``, ``optimizer``, ``scheduler`` and the values of ``stateful`` are
    anything with ``state_dict()`` and ``load_state_dict()``; any may be None.
    ``every_steps`` / ``every_seconds``: periodic saves, whichever comes first
    (None turns one off). Every other argument defaults to the agent's
    environment.
    """

    def __init__(
        self,
        model: Any = None,
        optimizer: Any = None,
        scheduler: Any = None,
        *,
        uri: str | None = None,
        every_steps: int | None = None,
        every_seconds: float | None = 600.0,
        keep_last: int | None = None,
        half: HalfMode | None = None,
        stateful: Mapping[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
        restore_rng: bool = True,
        part_bytes: int = DEFAULT_PART_BYTES,
        max_workers: int = DEFAULT_WORKERS,
        resume_from: str | None = None,
        job_uri: str | None = None,
        control_dir: str | os.PathLike[str] | None = None,
        handle_signal: bool = True,
    ) -> None:
        if half not in (None, "fp16", "bf16"):
            raise ValueError(f"half must be None, 'fp16' or 'bf16', not {half!r}")
        if keep_last is not None and keep_last < 1:
            raise ValueError("keep_last must be at least 1")
        if part_bytes < _ALIGN:
            raise ValueError(f"part_bytes must be at least {_ALIGN}")
        self._components: dict[str, Any] = {
            name: obj for name, obj in (("model", model), ("optimizer", optimizer), ("scheduler", scheduler))
            if obj is not None
        }
        for name, obj in (stateful or {}).items():
            self._components[f"stateful.{name}"] = obj
        self.extra: dict[str, Any] = dict(extra or {})
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.keep_last = keep_last
        self.half = half
        self.restore_rng = restore_rng
        self.part_bytes = part_bytes
        self.max_workers = max(1, max_workers)

        env = os.environ
        self.uri = uri or env.get(protocol.ENV_CHECKPOINT_URI) or None
        self.job_uri = job_uri or env.get(protocol.ENV_CHECKPOINT_ROOT) or None
        self.resume_from = resume_from or env.get(protocol.ENV_RESUME_FROM) or None
        control = control_dir or env.get(protocol.ENV_CONTROL_DIR)
        self.control_dir = Path(control) if control else None
        self._storage = Storage(self.uri, max_concurrency=self.max_workers) if self.uri else None
        if self._storage is None:
            log.warning("no checkpoint URI (pass uri= or set %s): checkpoints are off",
                        protocol.ENV_CHECKPOINT_URI)

        self._host = _HostBuffer()
        self._host_preparing: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._current: _Save | None = None
        self._last_committed: CheckpointInfo | None = None
        self._last_save_step = 0
        self._last_save_time = time.monotonic()
        # Test seams: called before each part's upload and before the manifest.
        self._before_part: Callable[[int, str], None] | None = None
        self._before_manifest: Callable[[int], None] | None = None

        self._flush_flag = False
        self._flush_mtime = self._flush_file_mtime()  # a request older than us is not ours
        self._previous_handler: Any = None
        self._signal_installed = False
        if handle_signal:
            self._install_signal_handler()
        # Only now that a flush request can be taken does the agent learn we are here.
        self._write_library_file()

    # --- context manager ------------------------------------------------------

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- public API ----------------------------------------------------------

    @property
    def last_committed(self) -> CheckpointInfo | None:
        """The newest checkpoint this object committed (or restored from)."""
        return self._last_committed

    def restore(self) -> int:
        """Load the newest good checkpoint into the components; the step it holds (0 if none).

        Tries ``RESUME_FROM`` first (then older ones), else the newest across
        the job's attempts (``SPOTBROKER_CHECKPOINT_JOB_URI``), else under
        ``uri``. A checkpoint that fails verification is skipped, with a
        warning, and reported in the ``resumed`` event.
        """
        skipped: list[dict[str, str]] = []
        for candidate in self._candidates():
            try:
                state, manifest = _load(Storage(candidate, max_concurrency=self.max_workers), self.max_workers)
            except CheckpointInvalid as exc:
                log.warning("checkpoint %s is unusable (%s); falling back to the previous one", candidate, exc)
                skipped.append({"uri": candidate, "reason": str(exc)})
                continue
            step = int(manifest["step"])
            self._apply(state)
            total = sum(int(o["size"]) for o in manifest["objects"].values())
            self._last_committed = CheckpointInfo(step=step, uri=candidate, bytes=total, reason="restored")
            self._last_save_step = step
            self._last_save_time = time.monotonic()
            log.info("restored step %d from %s%s", step, candidate,
                     f" (skipped {len(skipped)} unusable)" if skipped else "")
            data: dict[str, Any] = {"step": step, "uri": candidate}
            if skipped:
                data["skipped"] = skipped
            self._emit(protocol.RESUMED, data)
            return step
        if skipped:
            log.error("no usable checkpoint (%d skipped): starting from step 0", len(skipped))
            self._emit(protocol.RESUMED, {"step": 0, "uri": None, "skipped": skipped})
        return 0

    def step(self, step: int) -> None:
        """Call at each step boundary with the number of steps done so far.

        Persists at once when the agent asked for a flush, otherwise starts a
        periodic save when one is due. Cheap when nothing is due.
        """
        if self._storage is None:
            return
        self._reap()
        if self._flush_requested():
            self._flush(step)
            return
        if self._periodic_due(step):
            if self._busy():
                return  # the previous upload is still going: try at the next boundary
            self.save(step, reason="periodic", wait=False)
        elif self._host.tensor is None and self._host_preparing is None and (self.every_steps or self.every_seconds):
            self._prepare_host_buffer()

    def save(self, step: int, *, reason: str = "manual", wait: bool = True) -> CheckpointInfo | None:
        """Checkpoint now. ``wait=False``: snapshot, then upload in the background.

        Returns the committed checkpoint when ``wait`` (None when it failed).
        """
        if self._storage is None:
            return None
        started = time.monotonic()
        self._abandon_current(step)
        save = _Save(step=step, reason=reason, directory=protocol.step_dir(step), started=started)
        self._current = save
        self._last_save_step = step
        self._last_save_time = started
        try:
            self._uncommit(save.directory)
            self._snapshot_and_submit(save, pipelined=wait)
        except Exception as exc:
            # Training goes on: a checkpoint that fails is logged and reported, never raised.
            save.cancel.set()
            self._finish(save)  # waits for whatever was queued, then removes it
            save.error = exc
            log.error("checkpoint of step %d failed: %r", step, exc)
            return None
        if wait:
            self._finish(save)
            return save.result
        threading.Thread(target=self._finish, args=(save,), name=f"spotbroker-ckpt-{step}").start()
        return None

    def wait(self) -> CheckpointInfo | None:
        """Wait for a background upload; the newest committed checkpoint."""
        current = self._current
        if current is not None:
            current.done.wait()
        self._reap()
        return self._last_committed

    def close(self) -> None:
        """Wait for the background upload; tell the agent flushes are over."""
        self.wait()
        self._withdraw_library_file()
        if self._signal_installed and threading.current_thread() is threading.main_thread():
            previous = self._previous_handler
            # A late signal from the agent must not kill the process: SIGUSR1's
            # default action is to terminate, so it is ignored instead.
            if previous in (None, signal.SIG_DFL):
                previous = signal.SIG_IGN
            signal.signal(getattr(signal, protocol.FLUSH_SIGNAL), previous)
            self._signal_installed = False
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # --- flush requests --------------------------------------------------------

    def _install_signal_handler(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.info("not in the main thread: flush requests are read from %s at step boundaries",
                     protocol.FLUSH_FILE)
            return
        self._previous_handler = signal.signal(getattr(signal, protocol.FLUSH_SIGNAL), self._on_flush_signal)
        self._signal_installed = True

    def _on_flush_signal(self, signum: int, frame: Any) -> None:
        # Runs between two bytecodes of the main thread: set the flag, nothing else.
        self._flush_flag = True

    def _flush_file_mtime(self) -> int:
        if self.control_dir is None:
            return 0
        try:
            return (self.control_dir / protocol.FLUSH_FILE).stat().st_mtime_ns
        except OSError:
            return 0

    def _flush_requested(self) -> bool:
        # The file is read too, for a trainer whose handler could not be installed.
        mtime = self._flush_file_mtime()
        if mtime != self._flush_mtime:
            return True
        if self._flush_flag and mtime:
            # The agent writes flush.json, then signals: a signal whose file was
            # already handled (at a boundary between the two) is that request's echo.
            self._flush_flag = False
        return self._flush_flag

    def _flush(self, step: int) -> None:
        self._flush_flag = False
        self._flush_mtime = self._flush_file_mtime()
        request = self._read_flush_file()
        log.info("flush requested (%s, deadline %s): persisting step %d",
                 request.get("reason", "signal"), request.get("deadline", "unknown"), step)
        current = self._current
        if current is not None and current.step == step and not current.done.is_set():
            # A periodic save of this very state is under way: it is the flush.
            current.done.wait()
            self._reap()
            if current.result is not None:
                self._emit_committed(current.result, reason="flush")
                return
        last = self._last_committed
        if last is not None and last.step == step:
            # Nothing happened since that checkpoint (saved or restored): it is the flush.
            self._emit_committed(last, reason="flush")
            return
        if self.save(step, reason="flush", wait=True) is None:
            current = self._current
            error = current.error if current is not None else None
            # Tell the agent at once rather than let it wait for the deadline.
            self._emit(protocol.NO_FLUSH, {"reason": f"the checkpoint of step {step} failed: {error!r}"})

    def _read_flush_file(self) -> dict[str, Any]:
        if self.control_dir is None:
            return {}
        try:
            doc = json.loads((self.control_dir / protocol.FLUSH_FILE).read_text())
            return doc if isinstance(doc, dict) else {}
        except (OSError, ValueError):
            return {}

    # --- periodic saves ----------------------------------------------------------

    def _periodic_due(self, step: int) -> bool:
        if step <= self._last_save_step:
            return False
        if self.every_steps and step - self._last_save_step >= self.every_steps:
            return True
        return bool(self.every_seconds) and time.monotonic() - self._last_save_time >= self.every_seconds

    def _prepare_host_buffer(self) -> None:
        """Allocate (and fault in) the snapshot buffer in the background, well
        before the first periodic save, so that its stall is the copy alone."""
        tensors: list[Any] = []
        _flatten(self._state(0), tensors)
        layout = _plan(tensors, self.half, self.part_bytes)
        pin = any(t.device.type == "cuda" for t in tensors)
        self._host_preparing = threading.Thread(target=self._host.ensure, args=(layout, pin),
                                                name="spotbroker-ckpt-buffer", daemon=True)
        self._host_preparing.start()

    def _busy(self) -> bool:
        current = self._current
        return current is not None and not current.done.is_set()

    def _reap(self) -> None:
        """Forget a finished background save (its outcome is already logged)."""
        current = self._current
        if current is not None and current.done.is_set():
            self._current = None

    def _abandon_current(self, next_step: int) -> None:
        """Stop an upload in flight so that its buffer and bandwidth are free.
        Its objects are deleted; the newest committed checkpoint still stands."""
        current = self._current
        if current is None or current.done.is_set():
            return
        log.info("abandoning the unfinished checkpoint of step %d", current.step)
        current.cancel.set()
        if current.step == next_step:
            current.done.wait()  # its clean-up would delete what the next save writes
        else:
            current.parts_done.wait()

    def _uncommit(self, directory: str) -> None:
        """Saving a step again (same prefix): drop its manifest first, so that
        the old manifest never vouches for objects being replaced."""
        assert self._storage is not None
        manifest = f"{directory}/{protocol.MANIFEST}"
        if self._storage.exists(manifest):
            self._storage.delete(manifest)

    # --- making a checkpoint -----------------------------------------------------

    def _state(self, step: int) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "step": step,
            "components": {name: obj.state_dict() for name, obj in self._components.items()},
            "rng": _rng_state(),
            "extra": self.extra,
        }

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="spotbroker-ckpt-part")
        return self._pool

    def _snapshot_and_submit(self, save: _Save, *, pipelined: bool) -> None:
        """Copy the state into the host buffer and queue the uploads.

        pipelined (the caller waits: a flush): CPU tensors are uploaded in
        place, with no copy; others are queued part by part as their bytes
        land in the host buffer. Otherwise (a periodic save) all parts are
        queued after the copy, so that the caller's stall is the copy alone.
        """
        torch = _torch()
        tensors: list[Any] = []
        skeleton = _flatten(self._state(save.step), tensors)
        layout = _plan(tensors, self.half, self.part_bytes)
        parts = layout.parts()
        pool = self._executor()
        index = json.dumps(layout.to_json(), separators=(",", ":")).encode()
        state = pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)
        save.futures.append(pool.submit(self._upload_small, save, INDEX_OBJECT, index))
        save.futures.append(pool.submit(self._upload_small, save, STATE_OBJECT, state))
        if pipelined and not self.half and all(t.device.type == "cpu" for t in tensors):
            # The caller waits and the state stays put meanwhile: upload it in place.
            save.source = _TensorSource(tensors, layout)
            save.futures.extend(pool.submit(self._upload_part, save, number, begin, end)
                                for number, (begin, end) in enumerate(parts))
            return
        on_gpu = any(t.device.type == "cuda" for t in tensors)
        if self._host_preparing is not None:
            self._host_preparing.join()
        self._host.ensure(layout, pin=on_gpu)  # reuses the buffer while the layout holds
        save.source = _BufferSource(self._host.view)
        buffer = self._host.tensor
        queued = 0

        def queue_ready(filled_to: int) -> int:
            nonlocal queued
            while queued < len(parts) and parts[queued][1] <= filled_to:
                number, (begin, end) = queued, parts[queued]
                save.futures.append(pool.submit(self._upload_part, save, number, begin, end))
                queued += 1
            return queued

        for t, slot in zip(tensors, layout.slots):
            # Blocking copies when pipelined: a queued part must already hold its bytes.
            _slot_view(buffer, slot).copy_(t, non_blocking=on_gpu and not pipelined)
            if pipelined:
                queue_ready(slot.offset + slot.nbytes)
        if on_gpu:
            torch.cuda.synchronize()
        queue_ready(layout.total)

    def _upload_part(self, save: _Save, number: int, begin: int, end: int) -> tuple[str, int, str]:
        name = _part_name(number)
        if save.cancel.is_set():
            raise _Cancelled()
        if self._before_part is not None:
            self._before_part(save.step, name)
        assert self._storage is not None and save.source is not None
        segments = save.source.segments(begin, end)
        digest = hashlib.sha256()
        for segment in segments:
            digest.update(segment)
        self._storage.put(f"{save.directory}/{name}", segments)
        return name, end - begin, digest.hexdigest()

    def _upload_small(self, save: _Save, name: str, data: bytes) -> tuple[str, int, str]:
        if save.cancel.is_set():
            raise _Cancelled()
        assert self._storage is not None
        self._storage.put(f"{save.directory}/{name}", data)
        return name, len(data), hashlib.sha256(data).hexdigest()

    def _finish(self, save: _Save) -> None:
        """Wait for the objects, write the manifest (the commit), then report."""
        try:
            try:
                save.result = self._commit(save)
            except BaseException as exc:
                save.parts_done.set()
                if isinstance(exc, _Cancelled) or save.cancel.is_set():
                    log.info("checkpoint of step %d abandoned before its commit", save.step)
                else:
                    save.error = exc
                    log.error("checkpoint of step %d failed before its commit: %r", save.step, exc)
                self._discard(save)
                return
            # Committed: nothing below may undo it.
            self._last_committed = save.result
            log.info("checkpoint of step %d committed: %s, %.1f MB in %.2f s (%s)", save.step,
                     save.result.uri, save.result.bytes / 1e6, save.result.seconds or 0.0, save.reason)
            self._emit_committed(save.result, reason=save.reason)
            if self.keep_last:
                try:
                    self._prune()
                except Exception as exc:
                    log.warning("could not prune old checkpoints: %r", exc)
        finally:
            save.done.set()

    def _commit(self, save: _Save) -> CheckpointInfo:
        assert self._storage is not None
        wait(save.futures)
        save.parts_done.set()
        objects = {}
        for future in save.futures:
            name, size, digest = future.result()  # raises the first failure
            objects[name] = {"size": size, "sha256": digest}
        if save.cancel.is_set():
            raise _Cancelled()
        if self._before_manifest is not None:
            self._before_manifest(save.step)
        total = sum(o["size"] for o in objects.values())
        manifest = {
            "format": FORMAT,
            "step": save.step,
            "created_at": _now_iso(),
            "reason": save.reason,
            "job_id": os.environ.get(protocol.ENV_JOB_ID),
            "attempt_id": os.environ.get(protocol.ENV_ATTEMPT_ID),
            "bytes": total,
            "objects": dict(sorted(objects.items())),
        }
        self._storage.put(f"{save.directory}/{protocol.MANIFEST}", json.dumps(manifest, indent=1).encode())
        return CheckpointInfo(step=save.step, uri=self._storage.url(save.directory), bytes=total,
                              created_at=datetime.now(timezone.utc), seconds=time.monotonic() - save.started,
                              reason=save.reason)

    def _discard(self, save: _Save) -> None:
        """Best effort: remove the objects of a save that will never commit."""
        assert self._storage is not None
        try:
            self._storage.delete_prefix(save.directory)
        except Exception as exc:  # leftovers without a manifest are invisible anyway
            log.debug("could not clean up %s: %r", save.directory, exc)

    def _prune(self) -> None:
        """Keep the newest ``keep_last`` committed checkpoints of this attempt and
        every one marked KEEP; remove older ones and older unfinished leftovers."""
        assert self._storage is not None and self.keep_last
        by_step: dict[int, list[str]] = {}
        for obj in self._storage.iter():
            head, _, _ = obj.key.partition("/")
            if head.startswith("step-") and head[5:].isdigit():
                by_step.setdefault(int(head[5:]), []).append(obj.key)
        committed = sorted(s for s, keys in by_step.items() if f"{protocol.step_dir(s)}/{protocol.MANIFEST}" in keys)
        if not committed:
            return
        keep = set(committed[-self.keep_last:])
        for step, keys in by_step.items():
            directory = protocol.step_dir(step)
            # Never touch a step newer than the newest commit: it may be in flight.
            if step in keep or step > committed[-1] or f"{directory}/{KEEP_MARKER}" in keys:
                continue
            if self._storage.exists(f"{directory}/{KEEP_MARKER}"):
                continue  # marked while we were listing
            manifest = f"{directory}/{protocol.MANIFEST}"
            # The manifest goes first: a half-deleted checkpoint is then uncommitted, not corrupt.
            ordered = ([manifest] if manifest in keys else []) + [k for k in keys if k != manifest]
            try:
                self._storage.delete_many(ordered)
                log.info("deleted checkpoint %s (keep_last=%d)", self._storage.url(directory), self.keep_last)
            except Exception as exc:
                log.warning("could not delete %s: %r", self._storage.url(directory), exc)

    # --- restoring ------------------------------------------------------------

    def _candidates(self) -> list[str]:
        """Checkpoint URIs to try, best first."""
        search = self.job_uri or self.uri
        found = list_checkpoints(search) if search else []
        if not self.resume_from:
            return [c.uri for c in found]
        resume = self.resume_from.rstrip("/")
        match = re.search(r"step-(\d{12})$", resume)
        ceiling = int(match.group(1)) if match else None
        older = [c.uri for c in found if c.uri != resume and (ceiling is None or c.step <= ceiling)]
        return [resume] + older

    def _apply(self, state: dict[str, Any]) -> None:
        components = state.get("components", {})
        for name, obj in self._components.items():
            if name in components:
                obj.load_state_dict(components[name])
            else:
                log.warning("the checkpoint holds no state for %s", name)
        if self.restore_rng and state.get("rng"):
            _set_rng_state(state["rng"])
        self.extra = dict(state.get("extra") or {})

    # --- talking to the agent -------------------------------------------------

    def _write_library_file(self) -> None:
        if self.control_dir is None or self._storage is None:
            return  # no checkpoints: the agent must not wait for a flush
        try:
            self.control_dir.mkdir(parents=True, exist_ok=True)
            path = self.control_dir / protocol.LIBRARY_FILE
            temp = path.with_name(f".{path.name}.{os.getpid()}")
            temp.write_text(json.dumps({"pid": os.getpid(), "version": 1}))
            os.replace(temp, path)
        except OSError as exc:
            log.warning("cannot tell the agent we are here (%s): it will not ask for flushes", exc)

    def _withdraw_library_file(self) -> None:
        if self.control_dir is None:
            return
        path = self.control_dir / protocol.LIBRARY_FILE
        try:
            if json.loads(path.read_text()).get("pid") == os.getpid():
                path.unlink()
        except (OSError, ValueError, AttributeError):
            pass

    def _emit(self, event_type: str, data: dict[str, Any]) -> None:
        if self.control_dir is None:
            return
        try:
            protocol.append_event(self.control_dir, {"type": event_type, "at": _now_iso(), "data": data})
        except OSError as exc:
            log.warning("cannot append %s to %s: %s", event_type, protocol.EVENTS_FILE, exc)

    def _emit_committed(self, info: CheckpointInfo, reason: str) -> None:
        self._emit(protocol.CHECKPOINT_COMMITTED, {
            "step": info.step, "uri": info.uri, "bytes": info.bytes,
            "seconds": round(info.seconds or 0.0, 3), "reason": reason,
        })


# --------------------------------------------------------------------------
# Random number generators


def _rng_state() -> dict[str, Any]:
    torch = _torch()
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")  # only if the program uses it: never import it for them
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    # Only a CUDA context the program already made: never create one here.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    torch = _torch()
    if "python" in state:
        random.setstate(state["python"])
    if "torch" in state:
        torch.set_rng_state(state["torch"].contiguous())
    if "numpy" in state:
        try:
            import numpy
        except ImportError:
            log.warning("the checkpoint holds a NumPy RNG state but NumPy is not installed")
        else:
            numpy.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        states = state["cuda"]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)
        else:
            log.warning("CUDA RNG states for %d devices, %d present: not restored",
                        len(states), torch.cuda.device_count())
