"""The executor: carries out a Plan on a backend, with views into one arena.

Offsets are static, so every step's buffers are bound once per plan (views
into the arena) and a step is then just a kernel call. The executor keeps its
own account of the arena as it runs - what each step allocates and frees - so
its measured high-water mark can be checked against the plan's, and with
``check`` it proves that no two live buffers share a byte; with ``poison`` it
fills every freed region with NaN bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import NumericalError
from .schedule import aligned

POISON_BYTE = 0xFF   # all-ones is a NaN in every float format


@dataclass
class Context:
    """What an op may use besides its buffers."""

    k: object                 # kernel namespace of the backend
    rng: np.random.Generator  # dropout masks
    recompute: bool = False   # the forward runs again in the backward: do not touch statistics


class _Bound:
    """A plan bound to an arena: per step, the arrays each argument refers to."""

    def __init__(self, plan, arena, store):
        self.plan = plan
        sched = plan.schedule
        views = {}
        for t, off in plan.offsets.items():
            tt = sched.tensor(t)
            views[t] = arena[off:off + tt.nbytes].view(tt.spec.dtype).reshape(tt.spec.shape)

        def v(t):
            if t is None:
                return None
            return views[t] if t in views else store.view(sched.tensor(t))

        self.view = v
        self.args = [([v(t) for t in s.ins], [v(t) for t in s.outs], [v(t) for t in s.gouts],
                      [v(t) for t in s.gins], v(s.ws), [v(t) for t in s.reads], [v(t) for t in s.updates])
                     for s in plan.steps]
        n = len(plan.steps)
        self.allocs = [[] for _ in range(n)]
        self.frees = [[] for _ in range(n)]
        for t, (a, b) in plan.spans.items():
            self.allocs[a].append((plan.offsets[t], aligned(plan.sizes[t]), t))
            self.frees[b].append((plan.offsets[t], aligned(plan.sizes[t]), t))
        self.fetch = list(sched.outputs) + ([sched.loss] if sched.loss is not None else [])


class Executor:
    """Runs plans on one backend, growing one arena to the largest plan it has seen."""

    def __init__(self, backend, store, poison=False, check=False):
        self.backend = backend
        self.store = store
        self.poison, self.check = poison, check
        self.arena = backend.empty(0)
        self._bound: dict[int, _Bound] = {}
        self.high_water_bytes = 0       # measured arena high-water mark of the last run

    def bind(self, plan) -> _Bound:
        b = self._bound.get(id(plan))
        if b is None:
            if plan.arena_bytes > self.arena.nbytes:
                self.arena = self.backend.empty(plan.arena_bytes)
                self._bound.clear()
                if self.poison:
                    self.arena[...] = POISON_BYTE
            b = self._bound[id(plan)] = _Bound(plan, self.arena, self.store)
        return b

    def run(self, plan, ctx, feeds, optimizer=None, t=0) -> dict:
        """Run one iteration of ``plan``; ``feeds`` are the arrays for the load step.

        Returns host copies of the graph outputs and the loss, by tensor id."""
        b = self.bind(plan)
        sched = plan.schedule
        live: dict[int, tuple] = {}
        high = 0
        for i, step in enumerate(plan.steps):
            for off, size, tid in b.allocs[i]:
                if self.check:
                    self._check_free(live, off, size, tid, sched, step)
                live[tid] = (off, size)
                high = max(high, off + size)
            ins, outs, gouts, gins, ws, reads, updates = b.args[i]
            kind = step.kind
            if kind == "forward":
                step.node.op.forward(ctx, ins, outs, ws)
                if step.node.op.is_loss and not np.isfinite(outs[0]).all():
                    raise NumericalError(f"the loss is {float(outs[0])} at step {i} ({step.label}); "
                                         f"parameters were not updated")
            elif kind == "backward":
                step.node.op.backward(ctx, ins, outs, gouts, gins, ws)
            elif kind == "accumulate":
                ctx.k.add_inplace(updates[0], reads[0])
            elif kind == "update":
                optimizer.update(ins[0], ins[1], outs, ws, t)
            elif kind == "load":
                for dst, src in zip(outs, feeds):
                    np.copyto(dst, src, casting="same_kind")
            else:
                raise ValueError(f"unknown step kind {kind!r}")
            if i == len(plan.steps) - 1:
                fetched = {t: np.array(self.backend.to_host(b.view(t))) for t in b.fetch}
            for off, size, tid in b.frees[i]:
                del live[tid]
                if self.poison:
                    self.arena[off:off + size] = POISON_BYTE
        self.high_water_bytes = high
        return fetched

    @staticmethod
    def _check_free(live, off, size, tid, sched, step):
        for other, (o, s) in live.items():
            if off < o + s and o < off + size:
                raise AssertionError(f"step {step.index} ({step.label}): {sched.tensor(tid).name} "
                                     f"[{off}, {off + size}) overlaps live {sched.tensor(other).name} [{o}, {o + s})")
