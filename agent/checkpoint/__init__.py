"""Preemption-safe checkpoints for a PyTorch training loop: the public API.

::

    from spotbroker.agent.checkpoint import Checkpointer

The library runs in the trainer's process, beside the user's code; see
:mod:`spotbroker.agent.checkpoint.checkpointer` for what it does. Its modules:
``checkpointer`` (the public class), ``options`` (its knobs), ``format`` (the
objects on storage and reading them back verified), ``state`` (the state as a
skeleton plus tensors), ``upload`` (part uploads, the commit, pruning),
``hostbuffer`` (the snapshot's host memory), ``control`` (the agent's control
directory) and ``storage`` (one API for s3, gs, az and file URIs).
"""
from spotbroker.agent.checkpoint.checkpointer import Checkpointer, CheckpointMismatch
from spotbroker.agent.checkpoint.format import CheckpointInfo, CheckpointInvalid
from spotbroker.agent.checkpoint.listing import list_checkpoints, mark_keep
from spotbroker.agent.checkpoint.options import CheckpointOptions
from spotbroker.agent.checkpoint.state import TensorRef

__all__ = ["CheckpointInfo", "CheckpointInvalid", "CheckpointMismatch", "CheckpointOptions", "Checkpointer",
           "list_checkpoints", "mark_keep"]

# Pickle names a class by module and name: every state.pkl names its tensor
# placeholders spotbroker.agent.checkpoint._TensorRef (where the class lived
# first). This name keeps those files, and the ones written today, loadable.
_TensorRef = TensorRef
