"""What a checkpoint holds, taken apart: a small picklable skeleton plus a list of tensors.

The state (component state dicts, RNG states, ``extra``) is nested dicts, lists
and tuples. Every plain dense tensor in it is swapped for a :class:`TensorRef`
so that the skeleton pickles small and fast, and the tensors go to one raw
byte stream (:mod:`spotbroker.agent.checkpoint.format`) that can be hashed and
uploaded in parallel parts. torch is imported lazily, by the functions that
need it.
"""
from __future__ import annotations

import logging
import random
import sys
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("spotbroker.checkpoint")


def import_torch() -> Any:
    import torch  # the user's own; imported only when a checkpoint is made or read

    return torch


class TensorRef:
    """Stands in the pickled skeleton for the tensor at ``index`` in the stream."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return (TensorRef, (self.index,))


# Pickle names a class by its module and name, and every state.pkl written so far
# names this one spotbroker.agent.checkpoint._TensorRef (where it lived first; the
# package still exports it under that name). Keeping the name keeps state.pkl the same, readable by
# older and newer versions of the library alike.
TensorRef.__module__ = "spotbroker.agent.checkpoint"
TensorRef.__qualname__ = TensorRef.__name__ = "_TensorRef"


def streamable(t: Any) -> bool:
    """Plain dense tensors go to the byte stream; exotic ones (sparse,
    quantized, subclasses such as DTensor) are left to pickle."""
    torch = import_torch()
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided
            and not t.is_quantized and t.device.type != "meta")


def flatten(obj: Any, tensors: list[Any]) -> Any:
    """Replace every streamable tensor in nested dicts/lists/tuples by a TensorRef."""
    torch = import_torch()
    if isinstance(obj, torch.Tensor):
        if not streamable(obj):
            return obj
        tensors.append(obj.detach())
        return TensorRef(len(tensors) - 1)
    if type(obj) in (dict, OrderedDict):
        return same_mapping(obj, ((k, flatten(v, tensors)) for k, v in obj.items()))
    if type(obj) is list:
        return [flatten(v, tensors) for v in obj]
    if type(obj) is tuple:
        return tuple(flatten(v, tensors) for v in obj)
    return obj


def unflatten(obj: Any, tensors: list[Any]) -> Any:
    if isinstance(obj, TensorRef):
        return tensors[obj.index]
    if type(obj) in (dict, OrderedDict):
        return same_mapping(obj, ((k, unflatten(v, tensors)) for k, v in obj.items()))
    if type(obj) is list:
        return [unflatten(v, tensors) for v in obj]
    if type(obj) is tuple:
        return tuple(unflatten(v, tensors) for v in obj)
    return obj


def same_mapping(original: Any, items: Any) -> Any:
    """A mapping of the original's type; a module's state_dict keeps its
    ``_metadata`` (the module versions load_state_dict reads)."""
    mapping = type(original)(items)
    metadata = getattr(original, "_metadata", None)
    if metadata is not None:
        mapping._metadata = metadata
    return mapping


# --- random number generators ------------------------------------------------


def rng_state() -> dict[str, Any]:
    torch = import_torch()
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")  # only if the program uses it: never import it for them
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    # Only a CUDA context the program already made: never create one here.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    torch = import_torch()
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
