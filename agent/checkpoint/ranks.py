"""Where this process stands in a distributed run, and how its ranks agree.

The environment says it, as torchrun and SkyPilot set it: ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE`` (torchrun), ``SKYPILOT_NODE_RANK`` and
``SKYPILOT_NUM_NODES`` (SkyPilot, and the local launcher). One process with
none of them set is rank 0 of 1.

Ranks must save the same step: a flush asked of the ranks of one node (the
agent signals only its own node's processes) or a periodic save due by one
rank's clock has to become the decision of all of them at one step
boundary. :class:`Agreement` does it with one small all-reduce per
boundary, started without waiting (``async_op``) and read at the next
boundary, so that training never waits for it: every rank reads the same
reduced votes at the same boundary, and acts on them there. It runs on a
gloo group of its own, on CPU tensors, so that it never waits for a GPU
stream nor mixes with the training's own collectives.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spotbroker.agent.checkpoint.state import import_torch

log = logging.getLogger("spotbroker.checkpoint")

FLUSH_NONE, FLUSH_NOTICE, FLUSH_DRAIN = 0, 1, 2  # a flush vote; the larger wins


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "").strip()
    try:
        return int(value) if value else default
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


@dataclass(frozen=True)
class Ranks:
    """This process's place: global rank, rank on its node, node, and the sizes."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Ranks:
        env = os.environ if env is None else env
        world = _int(env, "WORLD_SIZE", 1)
        rank = _int(env, "RANK", 0)
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"RANK={rank} is not a rank of WORLD_SIZE={world}")
        # torchrun's GROUP_RANK is the node's rank among its nodes where SkyPilot's is not set.
        node = _int(env, "SKYPILOT_NODE_RANK", _int(env, "GROUP_RANK", 0))
        return cls(rank=rank, local_rank=_int(env, "LOCAL_RANK", 0), world_size=world, node_rank=node,
                   num_nodes=max(1, _int(env, "SKYPILOT_NUM_NODES", 1)))

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def writer(self) -> bool:
        """Writes the replicated state and every manifest."""
        return self.rank == 0

    @property
    def node_leader(self) -> bool:
        """Speaks for its node's ranks to its node's agent."""
        return self.local_rank == 0


@dataclass(frozen=True)
class Votes:
    """What one rank asks at a boundary; reduced by max, what any rank asked."""

    flush: int = FLUSH_NONE   # FLUSH_NOTICE / FLUSH_DRAIN: this rank's node was asked to flush
    time_due: bool = False    # every_seconds has passed on this rank's clock
    busy: bool = False        # this rank's previous upload is still going

    def values(self) -> list[int]:
        return [self.flush, int(self.time_due), int(self.busy)]


class Agreement:
    """The checkpoint library's own collectives among the ranks of one run.

    Every rank must call the same methods in the same order (they are
    collectives): :meth:`boundary` at each step boundary, and the others
    where the library's code path is the same on every rank (restore, and a
    save that :meth:`boundary` agreed on).
    """

    def __init__(self, ranks: Ranks) -> None:
        torch = import_torch()
        dist = torch.distributed
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                f"WORLD_SIZE={ranks.world_size}: call torch.distributed.init_process_group() before creating "
                "the Checkpointer (its ranks agree on every checkpoint through it)")
        if dist.get_world_size() != ranks.world_size or dist.get_rank() != ranks.rank:
            raise RuntimeError(f"the process group (rank {dist.get_rank()} of {dist.get_world_size()}) is not "
                               f"the environment's (RANK={ranks.rank}, WORLD_SIZE={ranks.world_size})")
        self.ranks = ranks
        self._dist = dist
        self._torch = torch
        self.group = dist.new_group(backend="gloo")  # a collective: every rank creates it here
        self._pending: tuple[Any, Any] | None = None  # (work, tensor) started at the last boundary

    def boundary(self, votes: Votes) -> Votes | None:
        """Hand in this boundary's votes; what all ranks voted at the previous
        boundary (None at the first): the same answer on every rank."""
        agreed = self._take()
        tensor = self._torch.tensor(votes.values(), dtype=self._torch.int64)
        work = self._dist.all_reduce(tensor, op=self._dist.ReduceOp.MAX, group=self.group, async_op=True)
        self._pending = (work, tensor)
        return agreed

    def settle(self) -> Votes | None:
        """The votes still in flight (at the end of the run), with none started after."""
        return self._take()

    def _take(self) -> Votes | None:
        if self._pending is None:
            return None
        work, tensor = self._pending
        self._pending = None
        work.wait()
        flush, time_due, busy = (int(v) for v in tensor.tolist())
        return Votes(flush=flush, time_due=bool(time_due), busy=bool(busy))

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """``obj`` of rank ``src``, on every rank."""
        box = [obj if self.ranks.rank == src else None]
        self._dist.broadcast_object_list(box, src=src, group=self.group)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        out: list[Any] = [None] * self.ranks.world_size
        self._dist.all_gather_object(out, obj, group=self.group)
        return out

    def close(self) -> None:
        self._take()  # never leave a collective behind
