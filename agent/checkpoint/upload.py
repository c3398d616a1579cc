"""Writing checkpoints: the parallel part uploads, the commit and the pruning.

A periodic save copies the state into the reused host buffer (the only stall
the training loop sees, see :mod:`spotbroker.agent.checkpoint.hostbuffer`) and
uploads its parts from there in the background; a flush, which the caller
waits for, uploads CPU tensors in place and GPU ones part by part as they
reach host memory. Each save is a :class:`Save`: its parts are hashed while
uploaded, and the manifest, written last, is the commit (see
:mod:`spotbroker.agent.checkpoint.format`). The :class:`Uploader` runs them.
"""
from __future__ import annotations

import bisect
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
from spotbroker.agent.checkpoint.format import (
    FORMAT,
    INDEX_OBJECT,
    KEEP_MARKER,
    STATE_OBJECT,
    CheckpointInfo,
    HalfMode,
    part_name,
    plan,
    slot_view,
)
from spotbroker.agent.checkpoint.hostbuffer import BufferSource, HostBuffer, TensorSource
from spotbroker.agent.checkpoint.state import flatten, import_torch
from spotbroker.agent.checkpoint.storage import Storage
from spotbroker.agent.protocol import now_iso

log = logging.getLogger("spotbroker.checkpoint")


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
    ranks_objects: dict[str, Any] = field(default_factory=dict)  # other ranks' objects for the manifest
    world_size: int = 1


def commit_manifest(storage: Storage, step: int, reason: str, objects: dict[str, Any], started: float,
                    fields: dict[str, Any]) -> CheckpointInfo:
    """Write the manifest of the checkpoint at ``storage`` (its step's prefix):
    the commit. Objects that others wrote (the ranks') are checked to be
    there at their size first: a checkpoint is committed only when every
    object it needs is."""
    for name, entry in objects.items():
        info = storage.head(name)
        if info is None or info.size != entry["size"]:
            raise RuntimeError(f"{name} is {'missing' if info is None else f'{info.size} bytes'}, "
                               f"not the {entry['size']} bytes its writer reported")
    total = sum(o["size"] for o in objects.values())
    manifest = {
        "format": FORMAT,
        "step": step,
        "created_at": now_iso(),
        "reason": reason,
        "job_id": os.environ.get(protocol.ENV_JOB_ID),
        "attempt_id": os.environ.get(protocol.ENV_ATTEMPT_ID),
        **fields,
        "bytes": total,
        "objects": dict(sorted(objects.items())),
    }
    storage.put(protocol.MANIFEST, json.dumps(manifest, indent=1).encode())
    return CheckpointInfo(step=step, uri=storage.url(), bytes=total, created_at=datetime.now(UTC),
                          seconds=time.monotonic() - started, reason=reason)


# --- the uploader -------------------------------------------------------------


class Uploader:
    """Makes the checkpoints of one :class:`~spotbroker.agent.checkpoint.Checkpointer`.

    Given what to save (``state(step)``, asked for at each save) and whom to
    tell of a commit (``on_commit(info, reason)``), it owns everything between
    a step boundary and a commit: the host buffer, the upload threads, the
    save in flight, the manifest and the pruning of old checkpoints.
    """

    def __init__(self, storage: Storage, *, state: Callable[[int], dict[str, Any]],
                 on_commit: Callable[[CheckpointInfo, str], None], half: HalfMode | None,
                 part_bytes: int, max_workers: int, keep_last: int | None,
                 best_step: Callable[[], int | None] = lambda: None,
                 on_pruned: Callable[[list[int]], None] = lambda steps: None) -> None:
        self.storage = storage
        self.on_pruned = on_pruned  # told the steps keep_last deleted
        self.best_step = best_step  # the early stop's best so far: its checkpoint is never pruned
        self._state = state
        self._on_commit = on_commit
        self.half = half
        self.part_bytes = part_bytes
        self.max_workers = max_workers
        self.keep_last = keep_last
        self.host = HostBuffer()
        self.host_preparing: threading.Thread | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.current: Save | None = None  # the newest save, until reaped
        # Test seams: called before each part's upload and before the manifest.
        self.before_part: Callable[[int, str], None] | None = None
        self.before_manifest: Callable[[int], None] | None = None

    def save(self, step: int, reason: str, *, wait: bool, started: float,
             extra_objects: dict[str, Any] | None = None, world_size: int = 1) -> CheckpointInfo | None:
        """Checkpoint ``step`` now (see :meth:`Checkpointer.save`); ``started``
        is the step boundary's ``time.monotonic()``; ``extra_objects``: what
        the other ranks wrote in the step's prefix, for the manifest."""
        self._abandon_current(step)
        save = Save(step=step, reason=reason, directory=protocol.step_dir(step), started=started,
                    ranks_objects=dict(extra_objects or {}), world_size=world_size)
        self.current = save
        try:
            self._uncommit(save.directory)
            self.snapshot_and_submit(save, pipelined=wait)
        except Exception as exc:
            # Training goes on: a checkpoint that fails is logged and reported, never raised.
            save.cancel.set()
            self._finish(save)  # waits for whatever was queued, then removes it
            save.error = exc
            log.error("checkpoint of step %d failed: %r", step, exc)
            return None
        except BaseException:
            # Interrupted (Ctrl-C, or SystemExit from the trainer's own SIGTERM handler):
            # end this save so that close() does not wait for it forever, then go on raising.
            save.cancel.set()
            self._finish(save)
            raise
        if wait:
            self._finish(save)
            return save.result
        threading.Thread(target=self._finish, args=(save,), name=f"spotbroker-ckpt-{step}").start()
        return None

    def wait(self) -> None:
        """Wait for the save in flight, if any."""
        current = self.current
        if current is not None:
            current.done.wait()
        self.reap()

    def close(self) -> None:
        """Free the host buffer and stop the threads (after :meth:`wait`)."""
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            self.pool = None
        if self.host_preparing is not None:
            self.host_preparing.join()  # it would start the copy threads again
            self.host_preparing = None
        self.host.close()

    def prepare_ahead(self) -> None:
        """Allocate (and fault in) the snapshot buffer in the background, well
        before the first periodic save, so that its stall is the copy alone.
        Once: a no-op when the buffer is there or on its way."""
        if self.host.tensor is not None or self.host_preparing is not None:
            return
        tensors: list[Any] = []
        flatten(self._state(0), tensors)
        layout = plan(tensors, self.half, self.part_bytes)
        pin = any(t.device.type == "cuda" for t in tensors)

        def prepare() -> None:
            self.host.ensure(layout, pin)
            self.host.start_copiers()

        self.host_preparing = threading.Thread(target=prepare, name="spotbroker-ckpt-buffer", daemon=True)
        self.host_preparing.start()

    def busy(self) -> bool:
        current = self.current
        return current is not None and not current.done.is_set()

    def reap(self) -> None:
        """Forget a finished background save (its outcome is already logged)."""
        current = self.current
        if current is not None and current.done.is_set():
            self.current = None

    def _abandon_current(self, next_step: int) -> None:
        """Stop an upload in flight so that its buffer and bandwidth are free.
        Its objects are deleted; the newest committed checkpoint still stands."""
        current = self.current
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
        self.storage.delete(f"{directory}/{protocol.MANIFEST}")  # a missing one is fine

    def _executor(self) -> ThreadPoolExecutor:
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="spotbroker-ckpt-part")
        return self.pool

    def snapshot_and_submit(self, save: Save, *, pipelined: bool) -> None:
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
        if self.host_preparing is not None:
            self.host_preparing.join()
        self.host.ensure(layout, pin=on_gpu)  # reuses the buffer while the layout holds
        save.source = BufferSource(self.host.view)
        buffer = self.host.tensor
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
            for i in self.host.copy_in(tensors, layout):
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
        if self.before_part is not None:
            self.before_part(save.step, name)
        assert save.source is not None
        digest = hashlib.sha256()  # fed by put with the very bytes it writes
        self.storage.put(f"{save.directory}/{name}", save.source.segments(begin, end), digest=digest)
        return name, end - begin, digest.hexdigest()

    def _upload_small(self, save: Save, name: str, data: bytes) -> tuple[str, int, str]:
        if save.cancel.is_set():
            raise Cancelled()
        self.storage.put(f"{save.directory}/{name}", data)
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
            log.info("checkpoint of step %d committed: %s, %.1f MB in %.2f s (%s)", save.step,
                     save.result.uri, save.result.bytes / 1e6, save.result.seconds or 0.0, save.reason)
            self._on_commit(save.result, save.reason)
            if self.keep_last:
                try:
                    self._prune()
                except Exception as exc:
                    log.warning("could not prune old checkpoints: %r", exc)
        finally:
            save.done.set()

    def _commit(self, save: Save) -> CheckpointInfo:
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
        if self.before_manifest is not None:
            self.before_manifest(save.step)
        if save.ranks_objects:  # the other ranks' own: written by them, checked here
            objects.update(save.ranks_objects)
        return commit_manifest(self.storage.child(save.directory), save.step, save.reason, objects, save.started,
                               {"world_size": save.world_size} if save.world_size > 1 else {})

    def _discard(self, save: Save) -> None:
        """Best effort: remove the objects of a save that will never commit."""
        try:
            self.storage.delete_prefix(save.directory)
        except Exception as exc:  # leftovers without a manifest are invisible anyway
            log.debug("could not clean up %s: %r", save.directory, exc)

    def _prune(self) -> None:
        """Keep the newest ``keep_last`` committed checkpoints of this attempt,
        the one holding the early stop's best weights, and every one marked
        KEEP; remove older ones and older unfinished leftovers."""
        assert self.keep_last
        by_step: dict[int, list[str]] = {}
        for obj in self.storage.iter():
            head, _, _ = obj.key.partition("/")
            if head.startswith("step-") and head[5:].isdigit():
                by_step.setdefault(int(head[5:]), []).append(obj.key)
        committed = sorted(s for s, keys in by_step.items() if f"{protocol.step_dir(s)}/{protocol.MANIFEST}" in keys)
        if not committed:
            return
        keep, pruned = set(committed[-self.keep_last:]), []
        best = self.best_step()
        if best is not None:  # the best weights (a `best` save, or the first after it): what the broker keeps
            keep.update(s for s in committed[bisect.bisect_left(committed, best):][:1])
        for step, keys in by_step.items():
            directory = protocol.step_dir(step)
            # Never touch a step newer than the newest commit: it may be in flight.
            if step in keep or step > committed[-1] or f"{directory}/{KEEP_MARKER}" in keys:
                continue
            if self.storage.exists(f"{directory}/{KEEP_MARKER}"):
                continue  # marked while we were listing
            manifest = f"{directory}/{protocol.MANIFEST}"
            # The manifest goes first: a half-deleted checkpoint is then uncommitted, not corrupt.
            ordered = ([manifest] if manifest in keys else []) + [k for k in keys if k != manifest]
            try:
                self.storage.delete_many(ordered)
                log.info("deleted checkpoint %s (keep_last=%d)", self.storage.url(directory), self.keep_last)
            except Exception as exc:
                log.warning("could not delete %s: %r", self.storage.url(directory), exc)
                continue
            if manifest in keys:
                pruned.append(step)
        if pruned:
            self.on_pruned(sorted(pruned))
