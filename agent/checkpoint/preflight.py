"""The library's side of a pre-flight (`SPOTBROKER_PREFLIGHT=1`, set by the
broker on a job's trial run on a CPU before any GPU is rented).

After `SPOTBROKER_PREFLIGHT_STEPS` steps (2 by default) the trainer is
stopped at its step boundary: the state is saved once (to a directory of
the node's own, never the job's storage, so that no GPU attempt resumes from
a trial's step), read back verified, and loaded into fresh copies of every
component, so that a checkpoint which cannot be loaded fails here too; then
the process exits 0. Any failure raises out of `ckpt.step()`, and the
trainer's traceback is what the broker shows.
"""
from __future__ import annotations

import copy
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotbroker.agent import protocol
from spotbroker.agent.checkpoint.format import load_checkpoint
from spotbroker.agent.checkpoint.storage import Storage

if TYPE_CHECKING:
    from spotbroker.agent.checkpoint.checkpointer import Checkpointer

log = logging.getLogger("spotbroker.checkpoint")
DEFAULT_STEPS = 2


class PreflightFailed(RuntimeError):
    """The pre-flight's checkpoint could not be saved, or not loaded back."""


class Preflight:
    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.dir = Path(tempfile.mkdtemp(prefix="spotbroker-preflight-"))
        self.uri = self.dir.as_uri()
        self._taken = 0
        self._began = time.monotonic()
        self.checked = False

    @classmethod
    def from_env(cls) -> Preflight | None:
        """A pre-flight when the environment says so, else None."""
        if os.environ.get(protocol.ENV_PREFLIGHT, "") not in ("1", "true"):
            return None
        raw = os.environ.get(protocol.ENV_PREFLIGHT_STEPS, "")
        try:
            steps = max(1, int(raw)) if raw else DEFAULT_STEPS
        except ValueError:
            log.warning("%s=%r is not a number: %d steps", protocol.ENV_PREFLIGHT_STEPS, raw, DEFAULT_STEPS)
            steps = DEFAULT_STEPS
        log.info("pre-flight: the trainer stops after %d steps, one save and its restore", steps)
        return cls(steps)

    def due(self) -> bool:
        """Counts a step boundary; True at the last one."""
        self._taken += 1
        return self._taken >= self.steps

    def finish(self, ckpt: Checkpointer, step: int) -> None:
        """Save, load back into fresh objects, and exit 0 (or raise)."""
        self.check(ckpt, step)
        ckpt.close()
        print(f"spotbroker pre-flight passed: {self._taken} steps, a checkpoint saved and loaded back, "
              f"in {time.monotonic() - self._began:.1f} s", flush=True)
        sys.exit(0)

    def check(self, ckpt: Checkpointer, step: int) -> None:
        """Save, and load back into fresh objects (raises PreflightFailed), once:
        at the last step, or at `close` for a run shorter than the pre-flight."""
        if self.checked:
            return
        self.checked = True
        info = ckpt.save(step, reason="preflight", wait=True)
        if ckpt.ranks.writer and not (ckpt.ranks.distributed or ckpt.sharded):
            if info is None:
                raise PreflightFailed(f"pre-flight: the checkpoint of step {step} could not be saved "
                                      "(see the log above)")
            self._load_fresh(ckpt, info.uri, step)

    def discard(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    @staticmethod
    def _load_fresh(ckpt: Checkpointer, uri: str, step: int) -> None:
        state, _ = load_checkpoint(Storage(uri), ckpt.max_workers)
        saved = state.get("components", {})
        for name, obj in ckpt._components.items():
            fresh = _fresh(obj)
            try:
                fresh.load_state_dict(saved[name])
            except Exception as exc:
                raise PreflightFailed(f"pre-flight: the checkpoint of step {step} does not load into {name} "
                                      f"({type(obj).__name__}): {type(exc).__name__}: {exc}") from exc


def _fresh(obj: Any) -> Any:
    """A copy to load into, so that a state which only loads over itself is
    caught; the object itself when it cannot be copied (the process ends
    right after)."""
    try:
        return copy.deepcopy(obj)
    except Exception:
        return obj


def device(local_rank: int) -> Any:
    """cuda (this process's GPU) where there is one, else cpu."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")
