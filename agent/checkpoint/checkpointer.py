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
* **Periodic saves** (every ``every_steps`` steps or ``every_seconds`` seconds, whichever
  comes first; or the broker's interval, see ``interval.py``) are two-phase: :meth:`Checkpointer.step`
  copies the state into one host buffer (the only stall; the buffer is reused
  from save to save), and a background thread hashes and uploads the parts in
  parallel while training goes on. If the previous upload is still running
  when the next save is due, that save is put off to the next boundary.
* **Flush on request.** The agent writes ``flush.json`` and sends ``SIGUSR1``
  when a preemption notice (or the broker's drain) comes; the handler only sets a flag, and the next
  :meth:`Checkpointer.step` persists the current state at once and returns
  when it is committed (CPU tensors are uploaded in place, with no copy; GPU
  ones part by part as they reach host memory), then appends
  ``checkpoint_committed`` to ``events.jsonl``. An older upload still in
  flight is abandoned first. If the window closes before the manifest is
  written, the newest committed periodic checkpoint still stands. A save that
  fails is logged (a flush also reports ``no_flush``); it never raises into
  the training loop. :meth:`Checkpointer.close` withdraws ``library.json``
  and frees the host buffer and the copy and upload threads.
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
  ``"fp16"`` stores floating tensors at half width, rounded (:mod:`.options`).
* **Metrics**: ``ckpt.report(step, val_loss=...)`` goes to the broker; under ``early_stop``
  the best are checkpointed, and ``ckpt.should_stop`` ends the loop (:mod:`.reports`).

torch is imported lazily: it is the user's own (>= 2.1), never a dependency.
``state.pkl`` is a pickle, like ``torch.load(weights_only=False)``: restore only
from storage you trust (the sha256 check guards against corruption, not
against an attacker who can write the manifest too).
"""
from __future__ import annotations

import logging
import operator
import os
import time
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from spotbroker.agent import protocol

# This module is the public API. Behind it: options (its knobs), format (the objects
# on storage, and reading them back verified), state (the state as skeleton + tensors,
# the RNG states), upload (the Uploader: part uploads, commit, pruning), hostbuffer
# (the snapshot's host memory), control (the agent's control directory) and storage.
from spotbroker.agent.checkpoint.control import ControlChannel, control_dir_from
from spotbroker.agent.checkpoint.distributed import RankedSaves
from spotbroker.agent.checkpoint.format import FORMAT, CheckpointInfo, CheckpointInvalid, load_checkpoint
from spotbroker.agent.checkpoint.interval import BrokerInterval
from spotbroker.agent.checkpoint.listing import restore_candidates
from spotbroker.agent.checkpoint.options import CheckpointOptions
from spotbroker.agent.checkpoint.preflight import Preflight, device
from spotbroker.agent.checkpoint.ranks import Agreement, Ranks
from spotbroker.agent.checkpoint.reports import BEST_KEY, Reports
from spotbroker.agent.checkpoint.state import rng_state, set_rng_state
from spotbroker.agent.checkpoint.storage import Storage
from spotbroker.agent.checkpoint.upload import Uploader

log = logging.getLogger("spotbroker.checkpoint")


class CheckpointMismatch(RuntimeError):
    """A verified checkpoint that does not load into the script's objects (a
    changed model, a different optimizer). Not skipped for an older one: they
    were saved by the same script. The process must start again (components
    before the one named may hold the checkpoint's state)."""


def _check_every(name: str, value: Any, kind: type | tuple[type, ...]) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, kind) or value <= 0):
        raise TypeError(f"Checkpointer(): {name} must be a positive number or None, not {value!r}")


class Checkpointer:
    """Saves and restores a training loop's state; see the module's docstring.

    ``model``, ``optimizer``, ``scheduler`` and the values of ``stateful`` are
    anything with ``state_dict()`` and ``load_state_dict()``; any may be None.
    ``every_steps`` / ``every_seconds``: periodic saves, whichever comes first
    (None turns one off). ``uri`` defaults to the agent's environment. The
    other knobs (``keep_last``, ``half``, ``part_bytes``...) are the fields of
    :class:`CheckpointOptions`: pass ``options=``, or any of them by name.
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
        stateful: Mapping[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
        options: CheckpointOptions | None = None,
        **knobs: Any,
    ) -> None:
        unknown = sorted(set(knobs) - {f.name for f in fields(CheckpointOptions)})
        if unknown:
            raise TypeError(f"Checkpointer() got an unexpected keyword argument {unknown[0]!r}")
        self.options = options = replace(options or CheckpointOptions(), **knobs)
        self._components: dict[str, Any] = {
            name: obj for name, obj in (("model", model), ("optimizer", optimizer), ("scheduler", scheduler))
            if obj is not None
        }
        for name, obj in (stateful or {}).items():
            self._components[f"stateful.{name}"] = obj
        for name, obj in self._components.items():  # not at the first save, nor at a resume hours later
            missing = [m for m in ("state_dict", "load_state_dict") if not callable(getattr(obj, m, None))]
            if missing:
                named = " or ".join(f"{m}()" for m in missing)
                raise TypeError(f"Checkpointer(): {name} ({type(obj).__name__}) has no {named}: "
                                "each component is saved by state_dict() and restored by load_state_dict()")
        if extra is not None and not isinstance(extra, dict):
            raise TypeError(f"Checkpointer(): extra must be a dict, not {type(extra).__name__}")
        # The very dict given: the trainer updates it, a save takes it as it is then, restore fills it in.
        self.extra: dict[str, Any] = extra if extra is not None else {}
        _check_every("every_steps", every_steps, int)
        _check_every("every_seconds", every_seconds, (int, float))
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.keep_last = options.keep_last
        self.half = options.half
        self.restore_rng = options.restore_rng
        self.part_bytes = options.part_bytes
        self.max_workers = max(1, options.max_workers)

        env = os.environ
        given = env.get(protocol.ENV_CHECKPOINT_URI)
        if uri and given and uri.rstrip("/") != given.rstrip("/"):
            # The broker records and resumes only from the attempt's own place: a script's
            # own bucket (`--checkpoint-uri`) lost every step at each preemption.
            log.warning("uri=%s is not where the broker keeps this attempt's checkpoints: they go to %s (%s), "
                        "the one place it records and resumes from", uri, given, protocol.ENV_CHECKPOINT_URI)
            uri = given
        self.uri = uri or given or None
        self.job_uri = options.job_uri or env.get(protocol.ENV_CHECKPOINT_ROOT) or None
        self.resume_from = options.resume_from or env.get(protocol.ENV_RESUME_FROM) or None
        self.control_dir = control_dir_from(options.control_dir)
        self.ranks = Ranks.from_env()
        self.sharded = options.sharded
        self.preflight = Preflight.from_env()
        if self.preflight is not None:  # its one save is a trial's: never in the job's storage, never resumed
            self.job_uri = self.resume_from = None
            self.uri = None if self.ranks.distributed or self.sharded else self.preflight.uri
        self._uploader: Uploader | None = None  # None: checkpoints are off, or another rank writes them
        self._ranked: RankedSaves | None = None  # None: one process, as without torch.distributed
        if self.uri and (self.ranks.distributed or self.sharded):
            self._ranked = RankedSaves(self, Agreement(self.ranks) if self.ranks.distributed else None)
            if self.sharded:
                from spotbroker.agent.checkpoint.sharded import import_dcp

                import_dcp()  # seconds of imports: paid at start, not inside a notice's window
        if self.uri and self.ranks.writer and not self.sharded:
            self._uploader = Uploader(Storage(self.uri, max_concurrency=self.max_workers), state=self._state,
                                      on_commit=self._committed, half=self.half, part_bytes=self.part_bytes,
                                      max_workers=self.max_workers, keep_last=self.keep_last,
                                      best_step=self._best_step, on_pruned=self._pruned)
        if not self.uri:
            log.warning("no checkpoint URI (pass uri= or set %s): checkpoints are off",
                        protocol.ENV_CHECKPOINT_URI)
        self._last_committed: CheckpointInfo | None = None
        self._last_save_step = 0
        self._last_save_time = time.monotonic()
        self._last_step: int | None = None
        self._went_back = False

        self._control = ControlChannel(self.control_dir, options.handle_signal)
        self._interval = BrokerInterval(self.control_dir, self._control.emit, every_seconds)  # the spec's, if any
        # Only now that a flush request can be taken does the agent learn we are here;
        # and only with checkpoints on: otherwise it must not wait for a flush.
        if self.uri:
            self._control.announce(self.ranks.rank, self.ranks.local_rank)
        self._reports = Reports(self)

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- public API ----------------------------------------------------------

    @property
    def device(self) -> Any:
        """The device to train on: this process's GPU where there is one, else the
        CPU (a pre-flight's, whose CUDA_VISIBLE_DEVICES is empty)."""
        return device(self.ranks.local_rank)

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
        search = self.job_uri or self.uri
        if self._ranked is not None:  # the writer rank lists; the others take its answer
            step, uri, skipped = self._ranked.restore(
                restore_candidates(search, self.resume_from) if self.ranks.writer else [])
            return self._restored(step, uri, skipped)
        skipped: list[dict[str, str]] = []
        for candidate in restore_candidates(search, self.resume_from):
            try:
                storage = Storage(candidate, max_concurrency=self.max_workers)
                state, manifest = load_checkpoint(storage, self.max_workers)
            except CheckpointInvalid as exc:
                log.warning("checkpoint %s is unusable (%s); falling back to the previous one", candidate, exc)
                skipped.append({"uri": candidate, "reason": str(exc)})
                continue
            self._apply(state, candidate)
            total = sum(int(o["size"]) for o in manifest["objects"].values())
            self._last_committed = CheckpointInfo(step=manifest["step"], uri=candidate, bytes=total,
                                                  reason="restored")
            return self._restored(manifest["step"], candidate, skipped)
        return self._restored(0, None, skipped)

    def _restored(self, step: int, uri: str | None, skipped: list[dict[str, str]]) -> int:
        """Tell the agent (rank 0 does, for all ranks) where the run goes on from."""
        if uri is None:
            if skipped:
                log.error("no usable checkpoint (%d skipped): starting from step 0", len(skipped))
                if self.ranks.writer:
                    self._control.emit(protocol.RESUMED, {"step": 0, "uri": None, "skipped": skipped})
            return 0
        self._last_save_step = step
        self._last_save_time = time.monotonic()
        log.info("restored step %d from %s%s", step, uri, f" (skipped {len(skipped)} unusable)" if skipped else "")
        data: dict[str, Any] = {"step": step, "uri": uri}
        if skipped:
            data["skipped"] = skipped
        if self.ranks.writer:
            self._control.emit(protocol.RESUMED, data)
        return step

    def report(self, step: int, **metrics: float) -> bool:
        """Report metrics at `step` (``val_loss=0.41``) to the broker; False once the run is to stop."""
        return self._reports.report(step, metrics)

    # The broker stopped the run early and its checkpoint is committed: leave the loop.
    should_stop = property(lambda self: self._reports.should_stop)

    def step(self, step: int) -> None:
        """Call at each step boundary with the number of steps done so far.

        Persists at once when the agent asked for a flush, otherwise starts a
        periodic save when one is due. Cheap when nothing is due.
        """
        given = step
        try:
            step = operator.index(step)  # an int, or NumPy's and torch's integers
        except TypeError:
            step = -1
        if step < 0:
            raise TypeError(f"Checkpointer.step(): give the number of steps done so far (an int >= 0), not {given!r}")
        if self._last_step is not None and step < self._last_step and not self._went_back:
            self._went_back = True
            log.warning("step went back from %d to %d: give the steps done in the whole run, not in an epoch "
                        "(checkpoints are named and resumed by it, and periodic saves wait for it to pass %d)",
                        self._last_step, step, self._last_save_step)
        self._last_step = step
        if self.preflight is not None and self.preflight.due():
            self.preflight.finish(self, step)  # exits 0, or raises
        uploader = self._uploader
        if uploader is not None:
            uploader.reap()
        self._reports.at_boundary(step)
        if self._ranked is not None:
            self._ranked.step(step)
            return
        if uploader is None:
            return
        if self._control.flush_requested():
            self._flush(step)
            return
        if self._periodic_due(step):
            if uploader.busy():
                return  # the previous upload is still going: try at the next boundary
            self.save(step, reason="periodic", wait=False)
        elif self.every_steps or self.every_seconds or self._control.dir is not None:
            # A flush may come at any step under an agent: its window must not
            # pay for the host buffer (pinned memory for GPU state takes seconds per GiB).
            uploader.prepare_ahead()

    def save(self, step: int, *, reason: str = "manual", wait: bool = True) -> CheckpointInfo | None:
        """Checkpoint now. ``wait=False``: snapshot, then upload in the background.

        Returns the committed checkpoint when ``wait`` (None when it failed).
        Under torch.distributed every rank calls it at the same step.
        """
        if self._ranked is not None:
            return self._ranked.save(step, reason, wait=wait).get("info")
        if self._uploader is None:
            return None
        started = time.monotonic()
        self._last_save_step = step
        self._last_save_time = started
        return self._uploader.save(step, reason, wait=wait, started=started)

    def wait(self) -> CheckpointInfo | None:
        """Wait for a background upload; the newest committed checkpoint."""
        if self._uploader is not None:
            self._uploader.wait()
        return self._last_committed

    def close(self) -> None:
        """Wait for the background upload; tell the agent flushes are over; free the
        host buffer and stop the threads. Under torch.distributed every rank calls it.

        After ``close`` no flush can be taken: a notice during work after the
        loop (an evaluation, an export) resumes from the newest checkpoint,
        and the steps since it are trained again. Call ``save(step)`` before
        ``close()`` when such work is long (it costs one upload of the state)."""
        try:
            if self.preflight is not None and self._last_step:  # a run shorter than the pre-flight's steps
                self.preflight.check(self, self._last_step)
        finally:
            if self._ranked is not None:
                self._ranked.close(self._last_step)
            self.wait()
            self._control.close()
            if self._uploader is not None:
                self._uploader.close()
            if self.preflight is not None:
                self.preflight.discard()

    # --- flush requests --------------------------------------------------------

    def _flush(self, step: int) -> None:
        assert self._uploader is not None
        request = self._control.take_flush_request()
        log.info("flush requested (%s, deadline %s): persisting step %d",
                 request.get("reason", "signal"), request.get("deadline", "unknown"), step)
        current = self._uploader.current
        if current is not None and current.step == step and not current.done.is_set():
            # A periodic save of this very state is under way: it is the flush.
            current.done.wait()
            self._uploader.reap()
            if current.result is not None:
                self._emit_committed(current.result, reason="flush")
                return
        last = self._last_committed
        if last is not None and last.step == step:
            # Nothing happened since that checkpoint (saved or restored): it is the flush.
            self._emit_committed(last, reason="flush")
            return
        if self.save(step, reason="flush", wait=True) is None:
            current = self._uploader.current
            error = current.error if current is not None else None
            # Tell the agent at once rather than let it wait for the deadline.
            self._control.emit(protocol.NO_FLUSH, {"reason": f"the checkpoint of step {step} failed: {error!r}"})

    # --- periodic saves ----------------------------------------------------------

    def _periodic_due(self, step: int) -> bool:
        return step > self._last_save_step and (self._steps_due(step) or self._time_due())

    def _steps_due(self, step: int) -> bool:  # (ranks agree on the time vote only: their every_steps stays)
        broker = self._ranked is None and self._interval.poll() is not None
        return bool(self.every_steps) and not broker and step - self._last_save_step >= self.every_steps

    def _time_due(self) -> bool:
        every = self._interval.poll() or self.every_seconds
        return bool(every) and time.monotonic() - self._last_save_time >= every

    def _state(self, step: int) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "step": step,
            "components": {name: obj.state_dict() for name, obj in self._components.items()},
            "rng": rng_state(),
            "extra": self.extra,
        }

    def _best_step(self) -> int | None:
        """The step of the early stop's best report so far, if the rule counts one."""
        best = self.extra.get(BEST_KEY) if self._reports.rule is not None else None
        return int(best[0]) if isinstance(best, list | tuple) and best and type(best[0]) is int else None

    # --- restoring ------------------------------------------------------------

    def _apply(self, state: dict[str, Any], uri: str) -> None:
        components = state.get("components", {})
        for name, obj in self._components.items():
            if name in components:
                try:
                    obj.load_state_dict(components[name])
                except Exception as exc:  # the script's model or optimizer is not the checkpoint's
                    raise CheckpointMismatch(
                        f"checkpoint {uri}: its {name} does not load into this {type(obj).__name__} (was the "
                        f"script changed since it was saved?): {exc}") from exc
            else:
                log.warning("the checkpoint holds no state for %s", name)
        if self.restore_rng and state.get("rng"):
            set_rng_state(state["rng"])
        self.extra.clear()
        self.extra.update(state.get("extra") or {})

    # --- talking to the agent -------------------------------------------------

    def _committed(self, info: CheckpointInfo, reason: str) -> None:
        """The uploader committed a checkpoint."""
        self._last_committed = info
        if self.preflight is None:  # a trial's save is no checkpoint of the job
            self._emit_committed(info, reason)

    def _pruned(self, steps: list[int]) -> None:
        """keep_last deleted these: the broker is told, so that it lists only what exists."""
        if self.preflight is None:
            for i in range(0, len(steps), protocol.MAX_PRUNED_STEPS):
                self._control.emit(protocol.CHECKPOINTS_PRUNED, {"steps": steps[i:i + protocol.MAX_PRUNED_STEPS]})

    def _emit_committed(self, info: CheckpointInfo, reason: str) -> None:
        self._control.emit(protocol.CHECKPOINT_COMMITTED, {
            "step": info.step, "uri": info.uri, "bytes": info.bytes,
            "seconds": round(info.seconds or 0.0, 3), "reason": reason,
        })

