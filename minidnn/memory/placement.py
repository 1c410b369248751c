"""Static offset assignment: each buffer into the lowest gap that holds it, greedy by size.

Buffers are placed largest first; each goes into the lowest gap, among the
buffers already placed whose lifetimes overlap its own, that holds it (first
fit). Among buffers of one size, the earliest start goes first. Packed
(``place_program(..., pack=True)``, which the planner asks for only where a
seed finds nothing that fits otherwise, and the exact reference for every plan), an
arena over the budget that fragments is placed again in two other orders, and the
smallest arena kept:

- the longest lifetime first among buffers of one size: a network's many buffers of
  one size (ResNet-50 at 6000x6000, layer after layer of 274.66 MiB) placed by start
  leave the long-lived ones to find room above the short ones laid down before them
  (a hybrid plan of ResNet-50 b1 in 8 GiB on v100-16gb: 6.44 GiB live, 8.58 GiB placed
  earliest first, 6.97 GiB longest first);
- lowest first: next, always the buffer whose lowest gap is lowest, the earliest start
  on a tie, which fills the arena from the bottom up, a layer of buffers that follow
  each other in time at a time. Where sizes mix (a random DAG's 1152 B activations and
  2304 B concatenations), largest first lays the large ones side by side at the bottom
  and the small ones stack above them: a plan of random DAG 16 (seed 0) with 4800 B live
  places in 5824 B by size, in either order, and in 4800 B lowest first. It is not the
  default: where the earliest-first arena is at its liveness peak already, lowest first
  is up to 15% above it (VGG-16 b256's 12 GiB plan on titanx-12gb).

The result is a set of offsets in which no two buffers live at the same
step overlap in memory; the arena size is the largest end offset. First fit
rather than the smallest gap (best fit): the planner's prefetched and held
buffers nest into the backward's, and best fit left slivers between them, up
to 9% of the arena on plans that retime their copies, where first fit packs
them to their liveness peak; over the benchmark's plans it is never worse.
The loops run in C++ (``minidnn._C.place_buffers``, ``place_buffers_lowest``): a deep
network's program has tens of thousands of buffers and the planner places several
candidate programs. ``place_program`` places a lowered program's residencies, in one
pool or in separate regions for resident and mobile tensors.
"""
from __future__ import annotations

from operator import attrgetter

import numpy as np

from .simulator import memory_curve

_tensor = attrgetter("tensor")


# The orders buffers are placed in, each into the lowest gap that holds it: largest first, among
# buffers of one size the earliest start (EARLIEST) or the longest lifetime (LONGEST) first; or
# LOWEST: next, always the buffer whose lowest gap is lowest (among equals the earliest start, then
# the largest), which fills the arena from the bottom up
EARLIEST, LONGEST, LOWEST = "earliest first", "longest first", "lowest first"


def place(starts, ends, sizes, base: int = 0, order: str = EARLIEST) -> np.ndarray:
    """Offsets (>= ``base``) of buffers alive over steps [starts[i], ends[i]] of ``sizes[i]``
    bytes (already aligned), placed in ``order`` (EARLIEST, LONGEST or LOWEST), ties then by the
    lower index."""
    from .. import _C
    as64 = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # noqa: E731
    starts, ends, sizes = as64(starts), as64(ends), as64(sizes)
    if not (len(starts) == len(ends) == len(sizes)):
        raise ValueError("starts, ends and sizes: expected 1-D arrays of one length")
    index = np.arange(len(sizes))
    if order == LOWEST:
        return _C.place_buffers_lowest(starts, ends, sizes, as64(np.lexsort((index, -sizes, starts))), int(base))
    within = starts if order == EARLIEST else starts - ends
    return _C.place_buffers(starts, ends, sizes, as64(np.lexsort((index, within, -sizes))), int(base))


def place_least(starts, ends, sizes, base: int = 0) -> np.ndarray:
    """place()'s offsets, earliest first, or where that fragments by more than 1% of its arena
    (above ``base``), the smallest arena of the three orders (the first on a tie)."""
    offsets = place(starts, ends, sizes, base)
    if not _fragments(peak(offsets, sizes) - base, live_peak(starts, ends, sizes)):
        return offsets
    return min((offsets, *(place(starts, ends, sizes, base, order) for order in (LONGEST, LOWEST))),
               key=lambda o: peak(o, sizes))


def _fragments(arena, live) -> bool:
    """Whether an arena of ``arena`` bytes for a liveness peak of ``live`` fragments by more than 1%
    of itself (once true of an arena, true of every larger one)."""
    return arena - live > arena // 100


def peak(offsets, sizes) -> int:
    """The arena bytes the placement needs: the highest end offset."""
    return int(np.max(np.asarray(offsets) + np.asarray(sizes), initial=0))


def live_peak(starts, ends, sizes) -> int:
    """The most bytes alive at any one step: no placement of these buffers needs a smaller arena."""
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    if not len(starts):
        return 0
    n = int(ends.max()) + 2
    # (bincount's float64 sums are exact: a step's sum stays far below 2^53 bytes)
    diff = (np.bincount(starts, sizes, n) - np.bincount(ends + 1, sizes, n)).astype(np.int64)
    return int(np.cumsum(diff).max())


def place_program(program, within=None, pack=False):
    """Offsets for every residency: resident and mobile (offloaded, prefetched, recomputed) tensors
    in separate regions, so the short-lived mobile buffers do not fragment the long-lived ones;
    where that still fragments by more than 1% of the arena, one pool is tried too and the smaller
    arena wins (the regions on a tie).

    The regions' arena holds the two regions' liveness peaks one above the other: where that sum
    already fragments by more than 1%, the pool is placed first, and where the pool's arena is
    below the sum, the regions cannot win and are not placed.

    Every buffer is placed earliest first among its size; with ``pack``, where that arena fragments
    and is over ``within`` (the arena the plan must fit; None: any), the same is done with
    place_least (the longest lifetime first and lowest first too) and the smaller arena kept.

    Returns (offsets by residency index, arena bytes, placement name).
    """
    first = _place_program(program, place)
    if pack and (within is None or first[1] > within):
        live = int(memory_curve(program).max(initial=0))
        if _fragments(first[1], live):
            first = min(first, _place_program(program, place_least), key=lambda c: c[1])
    offsets, arena, how = first
    return offsets.tolist(), arena, how


def _place_program(program, placer):
    """(offsets, arena, placement name) of place_program's regions or pool, each placed by ``placer``."""
    res = program.residencies
    starts, ends, sizes = program.buffers
    mobile = {r.tensor for r in res if r.origin != "compute" or r.wait_offload is not None}
    moving = np.fromiter(map(mobile.__contains__, map(_tensor, res)), bool, len(res))
    live = int(memory_curve(program).max(initial=0))

    def fragments(arena):
        return _fragments(arena, live)

    def single_pool():
        offsets = placer(starts, ends, sizes)
        return offsets, peak(offsets, sizes), "single pool"

    single = regions = None
    if moving.any():
        fixed = ~moving
        least = (live_peak(starts[fixed], ends[fixed], sizes[fixed])
                 + live_peak(starts[moving], ends[moving], sizes[moving]))
        if fragments(least):
            single = single_pool()
        if single is None or single[1] >= least:
            both = np.empty(len(res), np.int64)
            both[fixed] = placer(starts[fixed], ends[fixed], sizes[fixed])
            base = peak(both[fixed], sizes[fixed])
            both[moving] = placer(starts[moving], ends[moving], sizes[moving], base=base)
            regions = (both, peak(both, sizes), "resident and mobile regions")
    if single is None and (regions is None or fragments(regions[1])):
        single = single_pool()
    return min((c for c in (regions, single) if c is not None), key=lambda c: c[1])
