"""The knobs of a :class:`~spotbroker.agent.checkpoint.Checkpointer` beyond
what to save, where and when: each is a field of :class:`CheckpointOptions`
and may equally be passed to ``Checkpointer`` by name.

``half="bf16"`` or ``"fp16"`` stores floating tensors of one or more
dimensions at half width: half the bytes and upload time, at a price: the
restored weights and optimizer moments are rounded, so a resumed run no
longer matches an uninterrupted one bit for bit, and fp16 saturates beyond
±65504 (Adam's second moments can overflow or underflow) where bf16 keeps
float32's range with fewer mantissa bits. Scalars (such as optimizer step
counts) are always kept at full width."""
from __future__ import annotations

import os
from dataclasses import dataclass

from spotbroker.agent.checkpoint.format import ALIGN, HalfMode

DEFAULT_PART_BYTES = 16 * 1024 * 1024
DEFAULT_WORKERS = 8


@dataclass(frozen=True)
class CheckpointOptions:
    """How checkpoints are kept, stored and found; the ``None`` ones default to
    the agent's environment (see :mod:`spotbroker.agent.protocol`)."""

    keep_last: int | None = None          # delete this attempt's older checkpoints after each commit
    half: HalfMode | None = None          # store floating tensors at half width: "bf16" or "fp16"
    restore_rng: bool = True              # restore also sets the RNG states saved with the checkpoint
    part_bytes: int = DEFAULT_PART_BYTES  # the tensors' byte stream is uploaded in parts of this size
    max_workers: int = DEFAULT_WORKERS    # parallel part uploads and downloads
    resume_from: str | None = None        # the checkpoint to try first (RESUME_FROM)
    job_uri: str | None = None            # where to look for the newest across attempts
    control_dir: str | os.PathLike[str] | None = None  # the agent's control directory
    handle_signal: bool = True            # install the flush signal's handler (main thread only)
    # Every rank writes its shard through torch.distributed.checkpoint (FSDP, DTensor state); else
    # rank 0 writes the replicated state (DDP) and the other ranks their RNG states only.
    sharded: bool = False

    def __post_init__(self) -> None:
        if self.half not in (None, "fp16", "bf16"):
            raise ValueError(f"half must be None, 'fp16' or 'bf16', not {self.half!r}")
        if self.keep_last is not None and self.keep_last < 1:
            raise ValueError("keep_last must be at least 1")
        if self.part_bytes < ALIGN:
            raise ValueError(f"part_bytes must be at least {ALIGN}")
