"""The executor: carries out a Plan on a backend, with views into one arena.

Offsets are static, so every step's buffers are bound once per plan (views
into the arena, and into the host store for offloaded tensors) and a step is
then a kernel call. Offloads and prefetches go to the backend's copy stream;
a step waits for the prefetches of what it touches, and an offloaded buffer is
freed only once its copy is done. The executor keeps its own account of the
arena as it runs, so its measured high-water mark can be checked against the
plan's; with ``check`` it proves that no two live buffers share a byte, and
with ``poison`` it fills every freed region with NaN bytes.
"""
from __future__ import annotations

import bisect
import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from .errors import NumericalError
from .precision import is_low
from .schedule import aligned
from .transaction import InterruptGuard

POISON_BYTE = 0xFF   # all-ones is a NaN in every float format


@dataclass
class Context:
    """What an op may use besides its buffers."""

    k: object                 # kernel namespace of the backend
    rng: np.random.Generator  # dropout masks (drawn on the host, on every backend)
    recompute: bool = False   # the forward runs again in the backward: do not touch statistics
    algo: str = None          # the algorithm the plan chose for the current step (None: default)
    loss_scale: float = 1.0   # d(objective)/d(loss): 1/k for each of k sub-batches
    accumulate: tuple = ()    # the current backward adds into these inputs' gradients
    xp: object = np           # the array module of the backend (numpy, cupy)
    conv: object = None       # the backend's convolution algorithms (ops.conv_algos on the CPU)
    sync: object = None       # data-parallel: takes BatchNorm's statistics over every rank's batch
    grads: object = None      # data-parallel: starts each gradient bucket's reduction, waits for it
    scaling: object = None    # fp16: the step's loss scaling (grad_scaler.StepScaling), checked before updates

    def __post_init__(self):
        if self.conv is None:
            from .ops import conv_algos
            self.conv = conv_algos

    @classmethod
    def on(cls, backend, rng):
        return cls(backend.k, rng, xp=backend.xp, conv=backend.conv)


class _Bound:
    """A plan bound to an arena and a host store: per step, the arrays each argument refers to."""

    def __init__(self, plan, arena, host, store):
        self.plan = plan
        prog = plan.program
        by_tensor: dict[int, list] = {}
        for k, r in enumerate(prog.residencies):
            by_tensor.setdefault(r.tensor, []).append((r.start, r.end, k))
        for lst in by_tensor.values():
            lst.sort()

        def view(t, i):
            if t is None:
                return None
            tt = prog.tensors[t]
            if tt.persistent:
                return store.view(tt)
            lst = by_tensor[t]
            j = bisect.bisect_right(lst, (i, float("inf"), 0)) - 1
            start, end, k = lst[j]
            assert start <= i <= end, f"{tt.name} is not resident at step {i}"
            off = plan.offsets[k]
            return arena[off:off + tt.nbytes].view(tt.spec.dtype).reshape(tt.spec.shape)

        def host_view(t):
            tt = prog.tensors[t]
            off = prog.host_slots[t]
            return host[off:off + tt.nbytes].view(tt.spec.dtype).reshape(tt.spec.shape)

        self.view = view
        self.args = []
        for i, s in enumerate(prog.steps):
            v = lambda t: view(t, i)  # noqa: E731
            if s.kind == "offload":
                extra = (v(s.reads[0]), host_view(s.reads[0]))
            elif s.kind == "prefetch":
                extra = (v(s.writes[0]), host_view(s.writes[0]))
            else:
                extra = None
            self.args.append(([v(t) for t in s.ins], [v(t) for t in s.outs], [v(t) for t in s.gouts],
                              [v(t) for t in s.gins], v(s.ws), [v(t) for t in s.reads],
                              [v(t) for t in s.updates], extra))
        # per recomputation, which outputs it restores (the others are on the device)
        self.restore = [tuple(u in s.writes for u in s.outs) if s.kind == "recompute" else None
                        for s in prog.steps]
        n = len(prog.steps)
        self.allocs = [[] for _ in range(n)]
        self.frees = [[] for _ in range(n)]
        for k, r in enumerate(prog.residencies):
            size = aligned(prog.tensors[r.tensor].nbytes)
            self.allocs[r.start].append((plan.offsets[k], size, r.tensor))
            self.frees[r.end].append((plan.offsets[k], size, r.tensor, r.wait_offload))
        self.fetch = list(plan.schedule.outputs) + ([plan.schedule.loss] if plan.schedule.loss is not None else [])
        self.touched = [[t for t in s.touched if not prog.tensors[t].persistent] for s in prog.steps]
        self.first_update = next((i for i, s in enumerate(prog.steps) if s.kind == "update"), None)
        grads = plan.schedule.param_grads.values()
        self.param_grads = [view(t, self.first_update) for t in grads] if self.first_update is not None else []


class _Tracing:
    """Feeds a trace Recorder from the executor's loop (only for sampled iterations)."""

    def __init__(self, rec, plan, executor):
        self.rec, self.plan, self.executor = rec, plan, executor
        self.tensors = plan.program.tensors
        self.host_seen = set()

    def mem(self, action, tid, size, off, i):
        t = self.tensors[tid]
        self.rec.mem(self.rec.clock(), action, t.name, t.category, size, off, i)

    def host_copy(self, tid, i):
        if tid not in self.host_seen:
            self.host_seen.add(tid)
            t = self.tensors[tid]
            self.rec.mem(self.rec.clock(), "alloc", t.name, "host_copy", aligned(t.nbytes),
                         self.plan.program.host_slots[tid], i)

    def copy_span(self, step, i):
        nbytes = self.tensors[(step.reads or step.writes)[0]].nbytes
        return lambda start, end: self.rec.span("copy", step.label, step.kind, i, start, end, nbytes)

    def end(self, t, high):
        plan, store = self.plan, self.executor.store
        now = self.rec.clock()
        for tid in self.host_seen:              # the host store's copies end with the iteration
            tt = self.tensors[tid]
            self.rec.mem(now, "free", tt.name, "host_copy", aligned(tt.nbytes), plan.program.host_slots[tid])
        persistent = [(tt.name, tt.category, aligned(tt.nbytes)) for tt in plan.schedule.tensors if tt.persistent]
        self.rec.end(device=self.executor.backend.name, budget=plan.budget, persistent=persistent,
                     planned=[(i, plan.persistent_bytes + c) for i, c in enumerate(plan.live_curve)],
                     plan_peak=plan.peak_bytes, measured_peak=store.nbytes + high,
                     host_bytes=plan.host_bytes, iteration=t, predicted_seconds=plan.predicted_seconds,
                     unlimited_seconds=plan.unlimited_seconds)


class Executor:
    """Runs plans on one backend, growing one arena and one host store to the largest plan seen."""

    def __init__(self, backend, store, poison=False, check=False):
        self.backend = backend
        self.store = store
        self.poison, self.check = poison, check
        self.arena = backend.empty(0)
        self.host = backend.host_empty(0)
        self.copies = None
        self._bound: dict[int, _Bound] = {}
        self.high_water_bytes = 0       # measured arena high-water mark of the last run
        self.step_seconds = None        # per-step wall times of the last profiled run

    def release(self):
        """Free the arena and host store; the next run allocates what its plan needs."""
        self.arena = self.backend.empty(0)
        self.host = self.backend.host_empty(0)
        self._bound.clear()

    def bind(self, plan) -> _Bound:
        b = self._bound.get(id(plan))
        if b is None:
            if plan.arena_bytes > self.arena.nbytes:
                self._bound.clear()         # first: an interrupt must not leave plans bound to a dropped arena
                self.arena = self.backend.empty(plan.arena_bytes)
                if self.poison:
                    self.arena[...] = POISON_BYTE
            if plan.host_bytes > self.host.nbytes:
                self._bound.clear()
                self.host = self.backend.host_empty(plan.host_bytes)   # allocated once, up front
            if plan.host_bytes and self.copies is None:
                self.copies = self.backend.copy_stream()
            b = self._bound[id(plan)] = _Bound(plan, self.arena, self.host, self.store)
        return b

    def run(self, plan, ctx, feeds, optimizer=None, t=0, profile=False, recorder=None, txn=None) -> dict:
        """Run one iteration of ``plan``; ``feeds`` are the arrays for the load step.

        Returns host copies of the graph outputs and the loss, by tensor id.
        With ``profile``, ``step_seconds`` gets each step's wall time; a
        ``recorder`` (minidnn.trace.Recorder) gets spans and memory events.
        ``txn`` (a minidnn.transaction.Step) is polled before each program
        step, where a held Ctrl-C may be raised, and committed before the
        first update. On an exception the copy stream is drained first: no
        copy of the abandoned iteration lands in a buffer the next one uses.
        """
        b = self.bind(plan)
        rec = recorder if recorder is not None and recorder.begin(t) else None
        # fp16: a scaled gradient that overflows is the loss scaler's to find (the step is skipped),
        # not a warning from every kernel that meets the inf
        quiet = np.errstate(over="ignore", invalid="ignore") if ctx.scaling is not None else nullcontext()
        try:
            with self.backend.compute_scope(), quiet:
                return self._run(plan, b, ctx, feeds, optimizer, t, profile,
                                 _Tracing(rec, plan, self) if rec is not None else None, txn)
        except BaseException:
            if self.copies is not None:
                with InterruptGuard():
                    self.copies.drain()
            raise

    def _run(self, plan, b, ctx, feeds, optimizer, t, profile, tr, txn) -> dict:
        steps = plan.program.steps
        live: dict[int, tuple] = {}
        offloads: dict[int, object] = {}     # offload step index -> event
        arriving: dict[int, object] = {}     # tensor id -> prefetch event
        times = [] if profile else None
        high = 0
        fetched = {}
        feed = dict(zip(plan.schedule.inputs, feeds))      # input tensor id -> its array
        last = len(steps) - 1
        for i, step in enumerate(steps):
            if i == b.first_update and ctx.scaling is not None:   # fp16: unscale; inf/NaN skips the updates
                ctx.scaling.unscale(ctx.xp, b.param_grads)          # (before the commit: it may refuse)
            if txn is not None:
                txn.poll()                    # the last chance to stop comes before the first update
                if i == b.first_update:
                    txn.commit()
            for off, size, tid in b.allocs[i]:
                if self.check:
                    self._check_free(live, off, size, tid, plan, step)
                live[tid] = (off, size)
                high = max(high, off + size)
                if tr:
                    tr.mem("alloc", tid, size, off, i)
            ins, outs, gouts, gins, ws, reads, updates, copy = b.args[i]
            kind = step.kind
            if arriving:
                for tid in b.touched[i]:
                    ev = arriving.pop(tid, None)
                    if ev is not None:
                        self._wait(ev, tr, i, f"wait for prefetch {plan.program.tensors[tid].name}")
            ctx.algo, ctx.accumulate = step.algo, step.accumulate
            if ctx.grads is not None:              # an update waits for its gradients' reduction
                ctx.grads.before(plan, i, tr.rec if tr else None)
            t0 = time.perf_counter() if profile or tr else 0.0
            if kind == "forward":
                step.node.op.forward(ctx, ins, outs, ws)
                if step.node.op.is_loss and not bool(ctx.xp.isfinite(outs[0]).all()):
                    if ctx.scaling is not None:    # fp16: GradScaler skips the step (every gradient is inf)
                        ctx.scaling.nonfinite_loss()
                    else:
                        raise NumericalError(f"the loss is {float(outs[0])} at training step {t}, computed by "
                                             f"{step.label} (program step {i}); parameters were not updated")
            elif kind == "backward":
                step.node.op.backward(ctx, ins, outs, gouts, gins, ws)
            elif kind == "recompute":
                ctx.recompute = True
                try:
                    step.node.op.recompute(ctx, ins, outs, ws, b.restore[i])
                finally:
                    ctx.recompute = False
            elif kind == "offload":
                offloads[i] = self.copies.copy(copy[1], copy[0], tr.copy_span(step, i) if tr else None)
                if tr:
                    tr.host_copy(step.reads[0], i)
            elif kind == "prefetch":
                arriving[step.writes[0]] = self.copies.copy(copy[0], copy[1], tr.copy_span(step, i) if tr else None)
            elif kind == "accumulate":
                if is_low(updates[0].dtype):     # bf16/fp16 partial gradients: added in fp32, rounded once
                    ctx.xp.add(updates[0], reads[0], out=updates[0])
                else:
                    ctx.k.add_inplace(updates[0], reads[0])
            elif kind == "update":
                if ctx.scaling is None or not ctx.scaling.found_inf:
                    optimizer.update(ins[0], ins[1], outs, ws, t, ctx.k)
            elif kind == "load":
                for dst, tid in zip(outs, step.outs):
                    if tid in feed:
                        self.backend.load(dst, feed[tid])
            else:
                raise ValueError(f"unknown step kind {kind!r}")
            if profile:
                self.backend.synchronize()        # asynchronous backends: the step's own time
                times.append(time.perf_counter() - t0)
            if tr and kind not in ("offload", "prefetch"):
                tr.rec.span("compute", step.label, kind, i, t0, time.perf_counter())
            if ctx.grads is not None:              # a bucket whose last gradient this step wrote
                ctx.grads.after(plan, i, tr.rec if tr else None)
            if i == last:
                fetched = {tid: np.array(self.backend.to_host(b.view(tid, i))) for tid in b.fetch}
            for off, size, tid, wait in b.frees[i]:
                if wait is not None:
                    self._wait(offloads.pop(wait), tr, i, f"wait for offload {plan.program.tensors[tid].name}")
                del live[tid]
                if self.poison:
                    self.arena[off:off + size] = POISON_BYTE
                if tr:
                    tr.mem("free", tid, size, off, i)
        self.high_water_bytes = high
        if profile:
            self.step_seconds = times
        if tr:
            if ctx.grads is not None:
                ctx.grads.record(tr.rec)
            if self.copies is not None:
                self.copies.settle()          # the copies' spans, before the iteration's trace closes
            tr.end(t, high)
        return fetched

    def _wait(self, event, tr, i, what):
        if tr is None or event.is_set():
            self.copies.wait(event)
            return
        t0 = time.perf_counter()
        self.copies.wait(event)
        tr.rec.span("compute", what, "stall", i, t0, time.perf_counter())

    @staticmethod
    def _check_free(live, off, size, tid, plan, step):
        tensors = plan.program.tensors
        for other, (o, s) in live.items():
            if off < o + s and o < off + size:
                raise AssertionError(f"step {step.index} ({step.label}): {tensors[tid].name} "
                                     f"[{off}, {off + size}) overlaps live {tensors[other].name} [{o}, {o + s})")
