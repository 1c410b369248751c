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
    offs = np.empty(n, np.int64)
    lens = np.empty(n, np.int64)
    out = {}
    for k, t in enumerate(order):
        a, b = spans[t]
        size = aligned(sizes[t])
        mask = (starts[:k] <= b) & (ends[:k] >= a)
        best, best_gap, cursor = None, None, base
        if mask.any():
            o, ln = offs[:k][mask], lens[:k][mask]
            idx = np.argsort(o, kind="stable")
            for lo, l in zip(o[idx].tolist(), ln[idx].tolist()):
                gap = lo - cursor
                if gap >= size and (best_gap is None or gap < best_gap):
                    best, best_gap = cursor, gap
                cursor = max(cursor, lo + l)
        off = best if best is not None else cursor
        starts[k], ends[k], offs[k], lens[k] = a, b, off, size
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
