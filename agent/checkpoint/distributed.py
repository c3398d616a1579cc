"""A :class:`~spotbroker.agent.checkpoint.Checkpointer` among the ranks of a run.

Two ways to save, as PyTorch users do:

* **replicated** (DDP, the default): every rank holds the same model and
  optimizer, so rank 0 alone writes them, as one process would (the periodic
  save in the background, from host memory); every rank adds only its own
  RNG states (``rank-NNNNN.pkl``), which rank 0's manifest lists. Any world
  size restores it: each rank reads the whole state, and its own RNG states
  where the writer had the same rank.
* **sharded** (``sharded=True``: FSDP, ``torch.distributed.checkpoint``):
  every rank writes its shard through DCP (:mod:`.sharded`), at the boundary
  (a sharded save is synchronous); rank 0 writes the manifest once every
  rank's objects are there.

Every save is agreed at one step boundary (:class:`.ranks.Agreement`): a
flush that one node's agent asked for, or a periodic save due on one rank's
clock, is read by all ranks at the same later boundary, and all save that
step. ``every_steps`` is the same on every rank and needs no vote. A rank
that cannot take part (its upload still going) holds every rank's periodic
save back to the next boundary. After a flush each node's first rank tells
its own agent (``checkpoint_committed``, or ``no_flush`` with the reason),
so that every node's agent learns the outcome.
"""
from __future__ import annotations

import hashlib
import logging
import pickle
import time
from typing import TYPE_CHECKING, Any

from spotbroker.agent import protocol
from spotbroker.agent.checkpoint.format import (
    CheckpointInfo,
    CheckpointInvalid,
    fetch_verified,
    load_checkpoint,
    read_manifest,
)
from spotbroker.agent.checkpoint.ranks import FLUSH_NONE, FLUSH_NOTICE, Agreement, Votes
from spotbroker.agent.checkpoint.sharded import LAYOUT as SHARDED
from spotbroker.agent.checkpoint.sharded import apply_sharded, sharded_state
from spotbroker.agent.checkpoint.state import rng_state, set_rng_state
from spotbroker.agent.checkpoint.storage import Storage
from spotbroker.agent.checkpoint.upload import commit_manifest

if TYPE_CHECKING:
    from spotbroker.agent.checkpoint.checkpointer import Checkpointer

log = logging.getLogger("spotbroker.checkpoint")


def rank_object(rank: int) -> str:
    return f"rank-{rank:05d}.pkl"


class RankedSaves:
    """The Checkpointer's saves and restores when ranks must agree on them."""

    def __init__(self, ckpt: Checkpointer, agreement: Agreement | None) -> None:
        self.ckpt = ckpt
        self.ranks = ckpt.ranks
        self.agree = agreement
        self._stale = False  # the votes read next were cast before the save just made

    # --- the boundary ------------------------------------------------------------------

    def step(self, step: int) -> None:
        ckpt = self.ckpt
        uploader = ckpt._uploader
        votes = Votes(flush=FLUSH_NOTICE if ckpt._control.flush_requested() else FLUSH_NONE,
                      time_due=ckpt._time_due(), busy=uploader is not None and uploader.busy())
        agreed = self.agree.boundary(votes) if self.agree is not None else votes
        if agreed is None:
            return
        if self._stale:
            self._stale = False
            agreed = Votes(busy=True)  # a save started since these were cast: wait for the next
        if agreed.flush:
            self.flush(step)
        elif step > ckpt._last_save_step and (ckpt._steps_due(step) or agreed.time_due) and not agreed.busy:
            self.save(step, "periodic", wait=False)
        elif uploader is not None and (ckpt.every_steps or ckpt.every_seconds):
            uploader.prepare_ahead()

    def close(self, step: int | None) -> None:
        """The run's end: a flush agreed at the last boundary is still made."""
        if self.agree is None:
            return
        agreed = self.agree.settle()
        if agreed is not None and agreed.flush and not self._stale and step is not None:
            self.flush(step)

    # --- saving --------------------------------------------------------------------------

    def flush(self, step: int) -> None:
        ckpt = self.ckpt
        request = ckpt._control.take_flush_request() if ckpt._control.flush_requested() else {}
        log.info("flush agreed by the ranks (%s): persisting step %d", request.get("reason", "a peer's"), step)
        fresh = ckpt._last_save_step != step  # the same on every rank: saves are agreed
        if fresh:
            outcome = self.save(step, "flush", wait=True)
        else:  # this very state is saved (or being saved, or restored): that is the flush
            outcome = {}
            if self.ranks.writer:
                if ckpt._uploader is not None:
                    ckpt._uploader.wait()
                last = ckpt._last_committed
                outcome = ({"info": last} if last is not None and last.step == step
                           else {"error": f"the save of step {step} did not commit"})
            if self.agree is not None:
                outcome = self.agree.broadcast(outcome)
        info = outcome.get("info")
        if not self.ranks.node_leader or (fresh and self.ranks.writer and info is not None):
            return  # rank 0's own commit has told its agent already
        if info is not None:
            ckpt._emit_committed(info, reason="flush")
        else:
            ckpt._control.emit(protocol.NO_FLUSH, {"reason": outcome.get("error") or f"step {step} failed"})

    def save(self, step: int, reason: str, *, wait: bool) -> dict[str, Any]:
        """Save ``step`` on every rank (all call it at the same boundary); on
        every rank: ``{"info": CheckpointInfo}`` once committed (a wait), or
        ``{"error": why}``, or ``{}`` (a background save)."""
        ckpt = self.ckpt
        started = time.monotonic()
        ckpt._last_save_step, ckpt._last_save_time = step, started
        self._stale = True
        storage = Storage(ckpt.uri).child(protocol.step_dir(step))
        mine: dict[str, Any] = {}
        error = None
        try:
            mine.update(self._write_rank_state(storage))
            if ckpt.sharded:
                from spotbroker.agent.checkpoint.sharded import save_shards

                mine.update(save_shards(storage, sharded_state(ckpt._components), self._group()))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            error = f"rank {self.ranks.rank}: {exc!r}"
            log.error("checkpoint of step %d failed on this rank: %s", step, error)
        gathered = self.agree.gather((mine, error)) if self.agree is not None else [(mine, error)]
        errors = [e for _, e in gathered if e]
        objects = {name: entry for rank_objects, _ in gathered for name, entry in rank_objects.items()}
        outcome: dict[str, Any] = {}
        if self.ranks.writer:
            outcome = self._commit(step, reason, wait, started, storage, objects, errors)
        if wait and self.agree is not None:
            outcome = self.agree.broadcast(outcome)
        return outcome

    def _commit(self, step: int, reason: str, wait: bool, started: float, storage: Storage,
                objects: dict[str, Any], errors: list[str]) -> dict[str, Any]:
        ckpt = self.ckpt
        if errors:
            return {"error": "; ".join(errors)}
        if not ckpt.sharded:
            assert ckpt._uploader is not None
            info = ckpt._uploader.save(step, reason, wait=wait, started=started, extra_objects=objects,
                                       world_size=self.ranks.world_size)
            if not wait:
                return {}
            current = ckpt._uploader.current
            return {"info": info} if info else {"error": repr(current.error if current else None)}
        try:
            info = commit_manifest(storage, step, reason, objects, started,
                                   {"layout": SHARDED, "world_size": self.ranks.world_size})
        except Exception as exc:
            return {"error": f"the commit failed: {exc!r}"}
        ckpt._committed(info, reason)
        return {"info": info}

    def _write_rank_state(self, storage: Storage) -> dict[str, Any]:
        data = pickle.dumps({"rank": self.ranks.rank, "world_size": self.ranks.world_size, "rng": rng_state(),
                             "extra": self.ckpt.extra}, protocol=pickle.HIGHEST_PROTOCOL)
        storage.put(rank_object(self.ranks.rank), data)
        return {rank_object(self.ranks.rank): {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}

    def _group(self) -> Any:
        return self.agree.group if self.agree is not None else None

    # --- restoring -----------------------------------------------------------------------

    def restore(self, candidates: list[str]) -> tuple[int, str | None, list[dict[str, str]]]:
        """Try the candidates (rank 0's list) in order, every rank the same one,
        until all ranks load one: (step, uri, skipped)."""
        if self.agree is not None:
            candidates = self.agree.broadcast(candidates)
        skipped: list[dict[str, str]] = []
        for uri in candidates:
            try:
                manifest = self._load(uri)
                failure = None
            except CheckpointInvalid as exc:
                manifest, failure = None, str(exc)
            failures = self.agree.gather(failure) if self.agree is not None else [failure]
            why = next((f"rank {r}: {f}" for r, f in enumerate(failures) if f), None)
            if why is None:
                assert manifest is not None
                total = sum(int(o["size"]) for o in manifest["objects"].values())
                self.ckpt._last_committed = CheckpointInfo(step=int(manifest["step"]), uri=uri, bytes=total,
                                                           reason="restored")
                return int(manifest["step"]), uri, skipped
            log.warning("checkpoint %s is unusable (%s); falling back to the previous one", uri, why)
            skipped.append({"uri": uri, "reason": why})
        return 0, None, skipped

    def _load(self, uri: str) -> dict[str, Any]:
        ckpt = self.ckpt
        storage = Storage(uri, max_concurrency=ckpt.max_workers)
        if ckpt.sharded:
            from spotbroker.agent.checkpoint.sharded import load_shards

            manifest = read_manifest(storage)
            if manifest.get("layout") != SHARDED:
                raise CheckpointInvalid("written replicated (by one rank): restore it with sharded=False")
            state = sharded_state(ckpt._components)
            try:
                load_shards(storage, manifest["objects"], state, self._group())
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # DCP's CheckpointException is a BaseException
                raise CheckpointInvalid(f"the shards could not be read: {exc}") from exc
            apply_sharded(ckpt._components, state)
        else:
            state, manifest = load_checkpoint(storage, ckpt.max_workers)
            ckpt._apply(state, uri)
        self._apply_rank_state(storage, manifest)
        return manifest

    def _apply_rank_state(self, storage: Storage, manifest: dict[str, Any]) -> None:
        name = rank_object(self.ranks.rank)
        writers = manifest.get("world_size", 1)
        if name not in manifest["objects"]:
            if self.ranks.rank and self.ckpt.restore_rng:
                log.warning("the checkpoint was written by %s rank(s): rank %d keeps its own RNG states",
                            writers, self.ranks.rank)
            return
        own = pickle.loads(fetch_verified(storage, name, manifest["objects"]))
        if self.ckpt.restore_rng and writers == self.ranks.world_size:
            set_rng_state(own["rng"])
        if self.ckpt.sharded:
            self.ckpt.extra.clear()  # (the trainer's own dict, given as extra=: filled in, not replaced)
            self.ckpt.extra.update(own.get("extra") or {})
