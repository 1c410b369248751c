"""Static offset assignment: greedy by size, into the lowest gap that holds each buffer.

Buffers are placed largest first; each goes into the lowest gap, among the
buffers already placed whose lifetimes overlap its own, that holds it (first
fit). The result is a set of offsets in which no two buffers live at the same
step overlap in memory; the arena size is the largest end offset. First fit
rather than the smallest gap (best fit): the planner's prefetched and held
buffers nest into the backward's, and best fit left slivers between them, up
to 9% of the arena on plans that retime their copies, where first fit packs
them to their liveness peak; over the benchmark's plans it is never worse.
The loop runs in C++ (``minidnn._C.place_buffers``): a deep network's program
has tens of thousands of buffers and the planner places several candidate
programs.
"""
from __future__ import annotations

import numpy as np


def place(starts, ends, sizes, base: int = 0) -> np.ndarray:
    """Offsets (>= ``base``) of buffers alive over steps [starts[i], ends[i]] of ``sizes[i]``
    bytes (already aligned)."""
    from .. import _C
    as64 = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # noqa: E731
    return _C.place_buffers(as64(starts), as64(ends), as64(sizes), int(base))


def peak(offsets, sizes) -> int:
    """The arena bytes the placement needs: the highest end offset."""
    return int(np.max(np.asarray(offsets) + np.asarray(sizes), initial=0))


def live_peak(starts, ends, sizes) -> int:
    """The most bytes alive at any one step: no placement of these buffers needs a smaller arena."""
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    if not len(starts):
        return 0
    diff = np.zeros(int(ends.max()) + 2, np.int64)
    np.add.at(diff, starts, sizes)
    np.subtract.at(diff, ends + 1, sizes)
    return int(np.cumsum(diff).max())
