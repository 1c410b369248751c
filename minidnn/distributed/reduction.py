"""Gradient buckets reduced while the backward runs; each update waits for its own bucket only.

A :class:`GradientReducer` holds, per trainer, the buckets (views of the
persistent region, so the gradients are reduced where they lie) and, per plan
run, at which program step each bucket becomes ready and before which step
each is needed. A :class:`Reduction` is one mini-batch's: the executor calls
``after`` each step (starting the buckets that step completed) and ``before``
each step (waiting for the buckets an update reads).
"""
from __future__ import annotations

import numpy as np

from ..errors import DistributedError
from ..precision import is_low
from ..schedule import PARAM_GRAD
from ..trace import REDUCTION_WAIT
from .buckets import gradient_buckets, ready_steps


def gradient_dtype(schedule):
    """The one dtype of ``schedule``'s parameter gradients, which its buckets are reduced in: the master
    weights' (fp32 under mixed precision, as DDP's with autocast); DistributedError for a 2-byte one or
    several (a bucket is viewed as one dtype, and a sum of bf16/fp16 gradients would round at each rank)."""
    dtypes = sorted({np.dtype(t.spec.dtype) for t in schedule.tensors if t.category == PARAM_GRAD}, key=str)
    if len(dtypes) > 1 or any(is_low(d) for d in dtypes):
        raise DistributedError(f"gradient buckets are reduced in the master weights' dtype, but the parameter "
                               f"gradients are {', '.join(map(str, dtypes))}: mixed precision keeps them in float32")
    return dtypes[0] if dtypes else None


class GradientReducer:
    """The buckets of ``store``'s region and, per program, where they start and are waited for."""

    def __init__(self, reduce, store, bucket_bytes, tail_bytes):
        self.reduce = reduce                   # bytes-view -> Pending (the communication stream)
        self.layout = store.schedule
        self.buckets = gradient_buckets(self.layout, bucket_bytes, tail_bytes)
        self.dtype = gradient_dtype(self.layout)
        self.views = [store.region[b.start:b.stop].view(self.dtype) for b in self.buckets]
        self._bucket_of = {id(self.layout.tensor(t).value.param): b.index for b in self.buckets for t in b.grads}
        self._tables = {}

    def tables(self, plan):
        """(starts, waits) of ``plan``'s program: step index -> bucket indices."""
        tables = self._tables.get(id(plan))
        if tables is None:
            prog = plan.program
            starts, waits = {}, {}
            for k, i in enumerate(ready_steps(self.buckets, self.layout, prog.steps, prog.tensors)):
                if i is not None:
                    starts.setdefault(i, []).append(k)
            for i, s in enumerate(prog.steps):
                if s.kind == "update":
                    grad = prog.tensors[s.ins[1]]
                    waits.setdefault(i, []).append(self._bucket_of[id(grad.value.param)])
            tables = self._tables[id(plan)] = (plan, starts, waits)   # the plan kept: its id stays its own
        return tables[1], tables[2]

    def begin(self):
        return Reduction(self)


class Reduction:
    """One mini-batch's reductions, in flight or done."""

    def __init__(self, reducer):
        self.reducer = reducer
        self.pending = [None] * len(reducer.buckets)
        self.others = []        # the step's other collectives: (what, bytes, pending, (wait start, end))

    def start(self, k):
        if self.pending[k] is None:
            self.pending[k] = self.reducer.reduce(self.reducer.views[k])

    def after(self, plan, i, rec=None):
        for k in self.reducer.tables(plan)[0].get(i, ()):
            self.start(k)

    def before(self, plan, i, rec=None):
        for k in self.reducer.tables(plan)[1].get(i, ()):
            self.wait(k, rec, i)

    def wait(self, k, rec=None, i=-1):
        self.start(k)                          # a bucket no step completed (nothing wrote it): now
        p = self.pending[k]
        if rec is None or p.done.is_set():
            p.wait()
            return
        t0 = rec.clock()
        p.wait()
        rec.span("compute", f"{REDUCTION_WAIT} of bucket {k}", "stall", i, t0, rec.clock())

    def finish(self):
        """Wait for every bucket (all reduced: the mini-batch's gradients are the global ones)."""
        for k in range(len(self.pending)):
            self.wait(k)

    def record(self, rec):
        """The finished reductions as spans of the ``comm`` lane of trace Recorder ``rec``, and
        the other collectives (BatchNorm's), with the compute's waits for them as stalls."""
        for k, p in enumerate(self.pending):
            if p is not None and p.done.is_set() and p.seconds is not None:
                rec.span("comm", f"all-reduce bucket {k}", "allreduce", -1, *p.seconds, self.reducer.buckets[k].nbytes)
        for what, nbytes, p, (t0, t1) in self.others:
            if p.seconds is not None:
                rec.span("comm", what, "allreduce", -1, *p.seconds, nbytes)
            rec.span("compute", f"{REDUCTION_WAIT}: {what}", "stall", -1, t0, t1)
