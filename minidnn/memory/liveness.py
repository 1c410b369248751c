"""Liveness over a schedule: the step interval during which each arena tensor is held."""
from __future__ import annotations

import numpy as np


def intervals(schedule) -> dict:
    """tensor id -> (first step, last step) for every arena tensor the schedule touches.

    A tensor is held from the step that writes it to the last step that reads
    or updates it; the loss and the graph outputs stay to the end of the
    iteration, since the caller reads them afterwards.
    """
    first, last = {}, {}
    for s in schedule.steps:
        for t in s.touched:
            first.setdefault(t, s.index)
            last[t] = s.index
    end = len(schedule.steps) - 1
    for t in schedule.outputs + ([schedule.loss] if schedule.loss is not None else []):
        if t in last:
            last[t] = end
    persistent = {t.id for t in schedule.tensors if t.persistent}
    return {t: (first[t], last[t]) for t in first if t not in persistent}


def live_bytes(sizes: dict, spans: dict, n_steps: int) -> np.ndarray:
    """Bytes held at each step (sum over live tensors), by a difference array."""
    diff = np.zeros(n_steps + 1, np.int64)
    for t, (a, b) in spans.items():
        diff[a] += sizes[t]
        diff[b + 1] -= sizes[t]
    return np.cumsum(diff[:-1])
