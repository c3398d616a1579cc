"""Writing checkpoints: the host buffer, the parallel part uploads and the commit.

A periodic save copies the state into one reused host buffer (the only
stall the training loop sees) and uploads its parts from there in the
background; a flush, which the caller waits for, uploads CPU tensors in place
and GPU ones part by part as they reach host memory. Each save is a
:class:`Save`: its parts are hashed while uploaded, and the manifest, written
last, is the commit (see :mod:`spotbroker.agent.ckpt_format`).
"""
from __future__ import annotations

import bisect
import ctypes
import hashlib
import json
import logging
import os
import pickle
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from spotbroker.agent import protocol
from spotbroker.agent.ckpt_format import (
    ALIGN,
    FORMAT,
    INDEX_OBJECT,
    KEEP_MARKER,
    STATE_OBJECT,
    CheckpointInfo,
    HalfMode,
    Layout,
    byte_view,
    now_iso,
    part_name,
    plan,
    slot_view,
)
from spotbroker.agent.ckpt_state import flatten, import_torch
from spotbroker.agent.storage import Storage

log = logging.getLogger("spotbroker.checkpoint")


# --- where a part's bytes come from --------------------------------------------


class BufferSource:
    """Part bytes from a snapshot in the host buffer: one slice per part."""

    def __init__(self, view: memoryview) -> None:
        self.view = view

    def segments(self, begin: int, end: int) -> list[memoryview]:
        return [self.view[begin:end]]


PADDING = memoryview(bytes(ALIGN))


class TensorSource:
    """Part bytes straight from the live CPU tensors, with no copy at all.

    Only for saves the caller waits for (a flush): the tensors must not
    change until the upload is done.
    """

    def __init__(self, tensors: list[Any], layout: Layout) -> None:
        self.tensors = [t.contiguous() for t in tensors]  # a no-op for contiguous ones
        self.views = [byte_view(t) for t in self.tensors]
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
                out.append(PADDING[:gap])
                position += gap
                continue
            stop = min(end, slot.offset + slot.nbytes)
            if position < stop:
                out.append(self.views[i][position - slot.offset:stop - slot.offset])
                position = stop
            i += 1
        return out


def plain_bytes(t: Any, slot: Any) -> bool:
    """Whether ``t``'s memory already holds its slot's bytes as stored (a
    contiguous CPU tensor kept at its own dtype): then a raw memory copy will do."""
    return (t.device.type == "cpu" and slot.stored == slot.dtype and t.is_contiguous()
            and not t.is_conj() and not t.is_neg() and t.numel() * t.element_size() == slot.nbytes)


# The copy is split in pieces of whole pages (a multiple of ALIGN) across threads.
COPY_GRAIN = 1 << 16


def split_copies(jobs: list[tuple[int, int, int]], ways: int) -> list[list[tuple[int, int, int]]]:
    """Cut (dst, src, n) memory copies into ``ways`` runs of about equal bytes."""
    total = sum(n for _, _, n in jobs)
    share = -(-total // max(ways, 1) // COPY_GRAIN) * COPY_GRAIN or total
    runs: list[list[tuple[int, int, int]]] = [[]]
    room = share
    for dst, src, n in jobs:
        while n:
            if room == 0:
                runs.append([])
                room = share
            take = min(n, room)
            runs[-1].append((dst, src, take))
            dst, src, n, room = dst + take, src + take, n - take, room - take
    return [run for run in runs if run]


def run_copies(run: list[tuple[int, int, int]]) -> None:
    for dst, src, n in run:
        ctypes.memmove(dst, src, n)  # glibc's memmove, GIL released: the threads copy at once


def copy_threads() -> int:
    """Threads for the snapshot copy: as many as torch may use (memory bandwidth
    stops growing well before 8)."""
    return max(1, min(import_torch().get_num_threads(), 8))


class HostBuffer:
    """One pinned-if-useful uint8 buffer holding a snapshot; reused while the layout holds."""

    def __init__(self) -> None:
        self.layout: Layout | None = None
        self.tensor: Any = None
        self.view = memoryview(bytearray())
        self._copiers: ThreadPoolExecutor | None = None
        self._copier_count = 0

    def copy_in(self, tensors: list[Any], layout: Layout) -> list[int]:
        """Copy the plain CPU tensors into their slots with raw memory copies,
        the whole stream split evenly among as many threads as torch may use
        (glibc's memmove streams large copies past the cache: 1 GiB took
        0.07 s against 0.10-0.20 s for per-tensor ``Tensor.copy_`` on a
        2-core machine); return the indexes of the other tensors, which the
        caller copies with ``Tensor.copy_``."""
        base = self.tensor.data_ptr()
        jobs, others = [], []
        for i, (t, slot) in enumerate(zip(tensors, layout.slots)):
            if slot.nbytes and plain_bytes(t, slot):
                jobs.append((base + slot.offset, t.data_ptr(), slot.nbytes))
            elif slot.nbytes:
                others.append(i)
        runs = split_copies(jobs, copy_threads())
        if len(runs) > 1:
            pending = [self._copier_pool().submit(run_copies, run) for run in runs[1:]]
            run_copies(runs[0])
            for future in pending:
                future.result()
        elif runs:
            run_copies(runs[0])
        return others

    def _copier_pool(self) -> ThreadPoolExecutor:
        if self._copiers is None:
            self._copier_count = max(copy_threads() - 1, 1)
            self._copiers = ThreadPoolExecutor(max_workers=self._copier_count,
                                               thread_name_prefix="spotbroker-ckpt-copy")
        return self._copiers

    def start_copiers(self) -> None:
        """Start the copy threads ahead of the first save (a thread's start is
        slow on a busy machine and would count as stall)."""
        pool = self._copier_pool()
        wait([pool.submit(time.sleep, 0.01) for _ in range(self._copier_count)])

    def close(self) -> None:
        """Stop the copy threads and let the buffer go (pinned host memory is
        scarce); a later save starts both again."""
        if self._copiers is not None:
            self._copiers.shutdown(wait=True)
            self._copiers = None
            self._copier_count = 0
        self.tensor = None
        self.view = memoryview(bytearray())
        self.layout = None

    def ensure(self, layout: Layout, pin: bool) -> None:
        if self.layout is not None and self.layout.slots == layout.slots and self.tensor is not None:
            self.layout = layout
            return
        torch = import_torch()
        self.tensor = None  # let the old one go before allocating the new one
        # zeros, not empty: the alignment padding then hashes the same every time.
        self.tensor = torch.zeros(max(layout.total, 1), dtype=torch.uint8, pin_memory=pin)
        self.view = byte_view(self.tensor)[:layout.total]
        self.layout = layout


# --- one save in progress ----------------------------------------------------


class Cancelled(Exception):
    """The save was abandoned (a newer one needs the buffer): not a failure."""


@dataclass
class Save:
    """One checkpoint being written, from the step boundary to its commit (or not)."""

    step: int
    reason: str
    directory: str                       # the step's prefix, relative to the storage root
    started: float                       # time.monotonic() at the step boundary
    futures: list[Future[tuple[str, int, str]]] = field(default_factory=list)
    # Uploads the commit thread is to submit (a periodic save: off the training thread).
    deferred: list[tuple[Callable[..., tuple[str, int, str]], tuple[Any, ...]]] = field(default_factory=list)
    source: BufferSource | TensorSource | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    parts_done: threading.Event = field(default_factory=threading.Event)  # host buffer free again
    done: threading.Event = field(default_factory=threading.Event)
    result: CheckpointInfo | None = None
    error: BaseException | None = None


# --- the save machinery of Checkpointer ----------------------------------------


class UploadMixin:
    """How :class:`~spotbroker.agent.checkpoint.Checkpointer` makes a checkpoint.

    Kept apart from the public API so that each reads on its own. It works on
    the attributes Checkpointer's ``__init__`` sets (declared below) and calls
    its ``_state`` (what to save) and ``_emit_committed`` (tell the agent).
    """

    # Set by Checkpointer.__init__:
    _storage: Storage | None
    _host: HostBuffer
    _host_preparing: threading.Thread | None
    _pool: ThreadPoolExecutor | None
    _current: Save | None
    _last_committed: CheckpointInfo | None
    _before_part: Callable[[int, str], None] | None  # test seams
    _before_manifest: Callable[[int], None] | None
    half: HalfMode | None
    part_bytes: int
    max_workers: int
    keep_last: int | None
    # Methods of Checkpointer:
    _state: Callable[[int], dict[str, Any]]
    _emit_committed: Callable[[CheckpointInfo, str], None]

    def _prepare_host_buffer(self) -> None:
        """Allocate (and fault in) the snapshot buffer in the background, well
        before the first periodic save, so that its stall is the copy alone."""
        tensors: list[Any] = []
        flatten(self._state(0), tensors)
        layout = plan(tensors, self.half, self.part_bytes)
        pin = any(t.device.type == "cuda" for t in tensors)

        def prepare() -> None:
            self._host.ensure(layout, pin)
            self._host.start_copiers()

        self._host_preparing = threading.Thread(target=prepare, name="spotbroker-ckpt-buffer", daemon=True)
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
        self._storage.delete(f"{directory}/{protocol.MANIFEST}")  # a missing one is fine

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="spotbroker-ckpt-part")
        return self._pool

    def _snapshot_and_submit(self, save: Save, *, pipelined: bool) -> None:
        """Copy the state into the host buffer and queue the uploads.

        pipelined (the caller waits: a flush): CPU tensors are uploaded in
        place, with no copy; others are queued part by part as their bytes
        land in the host buffer. Otherwise (a periodic save) all parts are
        handed to the background thread that commits (:meth:`_commit`
        submits them), so that the caller's stall is the copy alone: not even
        the start of the upload threads.
        """
        torch = import_torch()
        tensors: list[Any] = []
        skeleton = flatten(self._state(save.step), tensors)
        layout = plan(tensors, self.half, self.part_bytes)
        parts = layout.parts()
        pool = self._executor()

        def submit(upload: Callable[..., tuple[str, int, str]], *args: Any) -> None:
            if pipelined:
                save.futures.append(pool.submit(upload, save, *args))
            else:
                save.deferred.append((upload, args))

        index = json.dumps(layout.to_json(), separators=(",", ":")).encode()
        state = pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)
        submit(self._upload_small, INDEX_OBJECT, index)
        submit(self._upload_small, STATE_OBJECT, state)
        if pipelined and not self.half and all(t.device.type == "cpu" for t in tensors):
            # The caller waits and the state stays put meanwhile: upload it in place.
            save.source = TensorSource(tensors, layout)
            for number, (begin, end) in enumerate(parts):
                submit(self._upload_part, number, begin, end)
            return
        on_gpu = any(t.device.type == "cuda" for t in tensors)
        if self._host_preparing is not None:
            self._host_preparing.join()
        self._host.ensure(layout, pin=on_gpu)  # reuses the buffer while the layout holds
        save.source = BufferSource(self._host.view)
        buffer = self._host.tensor
        queued = 0

        def queue_ready(filled_to: int) -> int:
            nonlocal queued
            while queued < len(parts) and parts[queued][1] <= filled_to:
                number, (begin, end) = queued, parts[queued]
                submit(self._upload_part, number, begin, end)
                queued += 1
            return queued

        if not pipelined and not on_gpu:
            # A periodic save from host memory: the copy is the training loop's stall.
            for i in self._host.copy_in(tensors, layout):
                slot_view(buffer, layout.slots[i]).copy_(tensors[i])
        else:
            for t, slot in zip(tensors, layout.slots):
                # Blocking copies when pipelined: a queued part must already hold its bytes.
                slot_view(buffer, slot).copy_(t, non_blocking=on_gpu and not pipelined)
                if pipelined:
                    queue_ready(slot.offset + slot.nbytes)
        if on_gpu:
            torch.cuda.synchronize()
        queue_ready(layout.total)

    def _upload_part(self, save: Save, number: int, begin: int, end: int) -> tuple[str, int, str]:
        name = part_name(number)
        if save.cancel.is_set():
            raise Cancelled()
        if self._before_part is not None:
            self._before_part(save.step, name)
        assert self._storage is not None and save.source is not None
        digest = hashlib.sha256()  # fed by put with the very bytes it writes
        self._storage.put(f"{save.directory}/{name}", save.source.segments(begin, end), digest=digest)
        return name, end - begin, digest.hexdigest()

    def _upload_small(self, save: Save, name: str, data: bytes) -> tuple[str, int, str]:
        if save.cancel.is_set():
            raise Cancelled()
        assert self._storage is not None
        self._storage.put(f"{save.directory}/{name}", data)
        return name, len(data), hashlib.sha256(data).hexdigest()

    def _finish(self, save: Save) -> None:
        """Wait for the objects, write the manifest (the commit), then report."""
        try:
            try:
                save.result = self._commit(save)
            except BaseException as exc:
                save.parts_done.set()
                if isinstance(exc, Cancelled) or save.cancel.is_set():
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

    def _commit(self, save: Save) -> CheckpointInfo:
        assert self._storage is not None
        if not save.cancel.is_set():
            pool = self._executor()
            save.futures.extend(pool.submit(upload, save, *args) for upload, args in save.deferred)
        save.deferred.clear()
        wait(save.futures)
        save.parts_done.set()
        objects = {}
        for future in save.futures:
            name, size, digest = future.result()  # raises the first failure
            objects[name] = {"size": size, "sha256": digest}
        if save.cancel.is_set():
            raise Cancelled()
        if self._before_manifest is not None:
            self._before_manifest(save.step)
        total = sum(o["size"] for o in objects.values())
        manifest = {
            "format": FORMAT,
            "step": save.step,
            "created_at": now_iso(),
            "reason": save.reason,
            "job_id": os.environ.get(protocol.ENV_JOB_ID),
            "attempt_id": os.environ.get(protocol.ENV_ATTEMPT_ID),
            "bytes": total,
            "objects": dict(sorted(objects.items())),
        }
        self._storage.put(f"{save.directory}/{protocol.MANIFEST}", json.dumps(manifest, indent=1).encode())
        return CheckpointInfo(step=save.step, uri=self._storage.url(save.directory), bytes=total,
                              created_at=datetime.now(UTC), seconds=time.monotonic() - save.started,
                              reason=save.reason)

    def _discard(self, save: Save) -> None:
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
