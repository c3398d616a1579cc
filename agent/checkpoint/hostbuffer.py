"""Where a save's bytes come from: the reused host buffer a snapshot is
copied into (the only stall a periodic save puts on the training loop), or
the live CPU tensors themselves (a flush, which the caller waits for)."""
from __future__ import annotations

import bisect
import ctypes
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from spotbroker.agent.checkpoint.format import ALIGN, Layout, byte_view
from spotbroker.agent.checkpoint.state import import_torch

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
