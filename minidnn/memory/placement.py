"""Static offset assignment: greedy by size, best-fitting gap (as in TFLite's arena planner).

Buffers are placed largest first; each goes into the smallest gap, among the
buffers already placed whose lifetimes overlap its own, that holds it. The
result is a set of offsets in which no two buffers live at the same step
overlap in memory; the arena size is the largest end offset.
"""
from __future__ import annotations

import numpy as np

from ..schedule import aligned


def place(spans: dict, sizes: dict, base: int = 0) -> dict:
    """tensor id -> offset (>= base) for buffers with lifetimes ``spans`` and ``sizes`` bytes."""
    order = sorted(spans, key=lambda t: (-sizes[t], spans[t][0], t))
    n = len(order)
    starts = np.empty(n, np.int64)
    ends = np.empty(n, np.int64)
    lo = np.empty(n, np.int64)      # placed offsets
    hi = np.empty(n, np.int64)      # placed offset + aligned size
    out = {}
    for k, t in enumerate(order):
        a, b = spans[t]
        size = aligned(sizes[t])
        off = base
        idx = np.flatnonzero((starts[:k] <= b) & (ends[:k] >= a))
        if idx.size:
            o = lo[idx]
            srt = np.argsort(o, kind="stable")
            o, e = o[srt], hi[idx][srt]
            reach = np.maximum.accumulate(e)                     # highest byte used below each buffer
            gap_lo = np.concatenate(([base], np.maximum(reach[:-1], base)))
            gaps = o - gap_lo
            fit = np.flatnonzero(gaps >= size)
            if fit.size:                                         # best fit: the smallest gap that holds it
                off = int(gap_lo[fit[np.argmin(gaps[fit])]])
            else:
                off = max(int(reach[-1]), base)
        starts[k], ends[k], lo[k], hi[k] = a, b, off, off + size
        out[t] = off
    return out


def peak(offsets: dict, sizes: dict) -> int:
    return max((offsets[t] + aligned(sizes[t]) for t in offsets), default=0)


def overlaps(offsets: dict, sizes: dict, spans: dict) -> list:
    """Pairs of tensors that are live at a common step and share bytes (should be empty)."""
    bad = []
    items = sorted(offsets, key=lambda t: offsets[t])
    for i, t in enumerate(items):
        for u in items[i + 1:]:
            if offsets[u] >= offsets[t] + sizes[t]:
                break
            (a, b), (c, d) = spans[t], spans[u]
            if a <= d and c <= b:
                bad.append((t, u))
    return bad
