"""The memory policies of the papers minidnn is measured against, as small planners.

Each is an object with ``name`` and ``evictions(facts, limit, cost)`` (facts: facts.Facts)
(and ``choose(...)``, which also returns the convolution algorithms, where the
paper picks them), asked through the one policy method ``chooser``
(policies.py); through ``plan_memory`` each yields the same :class:`Plan` as
minidnn's own ``auto``, and None where its rule cannot meet ``limit``.

The papers' unit is a layer; here it is a forward step of the schedule (a
convolution, a BatchNorm, a ReLU are separate steps), with the activations that
Caffe and Torch run in place counted in the layer before them where a paper's
rule says "one layer" (vDNN's prefetch one layer ahead). "Offload a layer's
data after the forward, bring it back for the backward" is the gap of a tensor
that spans the end of the forward pass (last forward touch to first backward
touch); a value with several consumers (residual adds, concatenations) is
offloaded with the last of them. No policy here evicts gradients (none of the
papers does). Where minidnn differs:

- recomputation is *memory-centric* (SuperNeurons' term): the lowering restores
  each dropped tensor just before its own backward use and drops the chain it
  recomputed on the way, so a segment of k dropped tensors costs up to
  k(k+1)/2 forward steps, not k (Chen et al.'s and SuperNeurons' speed-centric
  mode). Memory is never above the papers' figure; time may be;
- a ReLU here is not in place: it has buffers of its own, and its backward
  holds three feature maps where the papers' holds two. vDNN's prefetch one
  layer ahead that the arena cannot hold then waits until it can (VGG-16 b256
  in 12 GiB: the first block's convolution input, 3.06 GiB, copied with
  nothing to hide it), and an offload-only plan (vDNN, moDNN) pays that wait;
- vDNN's and moDNN's offloads run beside the step that last reads the tensor
  (``Evict.early``), as the papers' copy of a layer's input overlaps that
  layer, and the buffer is freed after it once the copy is done; SuperNeurons'
  (a convolution's output, which that step writes) is issued after the step
  and held one more (``delay=1``), so that its copy overlaps the next layer;
- ``plan_memory`` retimes every policy's offloads (``transfers.hide_transfers``) and
  keeps the retimed plan when it fits and is faster, so the baselines' copies
  are hidden at least as well as in their papers;
- sub-batching (moDNN) is the trainer's, for any policy, when ``plan_memory``
  raises MemoryBudgetError.
"""
from __future__ import annotations

import bisect
import dataclasses
import math
from collections import defaultdict

import numpy as np

from ..schedule import aligned
from .placement import place_program
from .program import Evict, lower, workspace_bytes
from .simulator import memory_curve
from .transfers import step_curve

CONV_OPS = ("conv2d", "conv_transpose2d")
# SuperNeurons' "cheap" layers: pooling, activation, normalization (LRN there, BatchNorm here)
CHEAP_OPS = ("batch_norm2d", "relu", "leaky_relu", "sigmoid", "tanh", "max_pool2d", "avg_pool2d")


# activations that Caffe and Torch run in place on their input where nothing else reads it: the papers
# count such an activation as part of the layer before it (VGG's conv+ReLU is one layer)
ACTIVATIONS = ("relu", "leaky_relu", "sigmoid", "tanh")


# -- the papers' layers, which every baseline reads ------------------------------------
class Layers:
    """The schedule's facts (facts.Facts: its forward steps, where the forward ends, who produces
    what, where each backward step is) and the papers' view of them: who reads what in the forward,
    and the papers' layers (a step with its in-place activations)."""

    def __init__(self, facts):
        schedule = self.schedule = facts.schedule
        self.touch, self.forward, self.end, self.producer = facts.touch, facts.forward, facts.last_forward, facts.producer
        self.backward, self.only_reads = facts.backward, facts.only_reads
        self.consumers = defaultdict(list)
        for s in self.forward:
            for u in dict.fromkeys(s.ins):
                if u is not None:
                    self.consumers[u].append(s)
        first = {}                            # forward node id -> the first forward step of its layer
        for s in self.forward:
            src = self.producer.get(s.ins[0]) if s.ins else None
            in_place = (s.node.op.name in ACTIVATIONS and src is not None and len(self.consumers[s.ins[0]]) == 1)
            first[s.node.id] = first[src.node.id] if in_place else s.index
        self.layer = {i: first[schedule.steps[i].node.id] for i in self.backward}

    def crossing(self, t):
        """The gap of ``t`` from its last forward touch to its first backward touch (None if none,
        or if no step lies between them)."""
        ts = self.touch.get(t)
        if not ts or self.schedule.tensors[t].persistent:
            return None
        g = bisect.bisect_right(ts, self.end) - 1
        if g < 0 or g + 1 >= len(ts) or ts[g + 1] - ts[g] < 2:
            return None
        return g

    def one_layer_ahead(self, b):
        """Schedule steps from the start of the backward of the layer after step ``b``'s (the papers'
        layer: the backward of its in-place activation runs just before ``b`` and is ``b``'s own) to
        ``b``: a prefetch issued that many steps early overlaps the backward of the next-later
        layer (vDNN). 1 where no such layer runs before ``b``."""
        k = bisect.bisect_left(self.backward, b) - 1
        own = self.layer.get(b)
        while k >= 0 and self.backward[k] > self.end and self.layer[self.backward[k]] == own:
            k -= 1
        if k < 0 or self.backward[k] <= self.end:
            return 1
        later = self.layer[self.backward[k]]
        while k > 0 and self.backward[k - 1] > self.end and self.layer[self.backward[k - 1]] == later:
            k -= 1
        return b - self.backward[k]


    def offload(self, t, delay=1, early=False):
        """``t`` offloaded across its forward-to-backward gap and prefetched one backward layer ahead;
        ``early``: its copy issued as its last forward touch starts, where that touch only reads it,
        and the buffer freed after that touch (else after the touch, held ``delay`` steps)."""
        g = self.crossing(t)
        if g is None:
            return {}
        early = early and self.only_reads(t, self.touch[t][g])
        return {(t, g): Evict("offload", delay=0 if early else delay, lead=self.one_layer_ahead(self.touch[t][g + 1]),
                              early=early)}


def live_bytes(facts, evictions, algos=None) -> int:
    """The largest sum of arena bytes live at one step of the lowered plan (placement not included)."""
    return int(memory_curve(lower(facts.schedule, evictions, facts, algos or {})).max(initial=0))


def approximate_curve(facts, algos=None) -> np.ndarray:
    """Arena bytes live at each schedule step with nothing evicted, with ``algos``' workspaces."""
    schedule = facts.schedule
    diff = np.zeros(len(schedule.steps) + 1, np.int64)
    for t, ts in facts.touch.items():
        size = aligned(schedule.tensors[t].nbytes)
        diff[ts[0]] += size
        diff[facts.last_use(t) + 1] -= size
    curve = np.cumsum(diff[:-1])
    for i, a in (algos or {}).items():
        ws = schedule.steps[i].ws
        curve[i] += aligned(a.workspace) - (aligned(schedule.tensors[ws].nbytes) if ws is not None else 0)
    return curve


def downgrade_at_peak(facts, evictions, options, algos, limit):
    """vDNN's greedy algorithm choice: while the plan is over ``limit``, give the step with the most
    bytes live among those over it (and with a smaller-workspace algorithm) its fastest smaller one.
    Returns the algorithms, or None if no downgrade is left and it still does not fit."""
    program = lower(facts.schedule, evictions, facts, algos)
    return downgrade(memory_curve(program), program.origin, options, algos, limit)


def downgrade(curve, origin, options, algos, limit):
    """:func:`downgrade_at_peak` on ``curve`` (bytes at each step; ``origin``: the schedule step each
    runs), lowered in place as workspaces shrink (a workspace lives only during its own step)."""
    cur = dict(algos)
    runs = defaultdict(list)                     # schedule step -> steps of the curve running it
    for i, o in enumerate(origin):
        if o in options:
            runs[o].append(i)
    while curve.max(initial=0) > limit:
        best = None
        for i in np.flatnonzero(curve > limit):
            o = origin[i]
            if o not in options or (best is not None and curve[i] <= best[0]):
                continue
            ws = cur.get(o, options[o][0][1]).workspace
            smaller = [a for _, a in options[o] if a.workspace < ws]
            if smaller:
                best = (curve[i], o, smaller[0])
        if best is None:
            return None
        _, o, a = best
        curve[runs[o]] -= aligned(cur.get(o, options[o][0][1]).workspace) - aligned(a.workspace)
        cur[o] = a
    return cur


class _Baseline:
    """A paper's rule: ``evictions`` (its own algorithms where it picks them: ``choose``), asked
    for each limit through the one policy method, ``chooser``."""

    def chooser(self, facts, cost, options, algos):
        return lambda limit: self.choose(facts, limit, cost, options, algos)

    def choose(self, facts, limit, cost, options, algos):
        ev = self.evictions(facts, limit, cost, algos)
        return (None, None) if ev is None else (ev, algos)

    def __repr__(self):
        return f"<memory policy {self.name}>"


def _feature_map(schedule, step, t) -> bool:
    """Whether output ``t`` of ``step`` is a feature map, not per-channel statistics (BatchNorm's mean
    and inverse deviation: a few hundred bytes, kept rather than re-running the layer for them)."""
    return 64 * schedule.tensors[t].nbytes >= schedule.tensors[step.ins[0]].nbytes


# -- vDNN ------------------------------------------------------------------------------
def layerwise_offloads(facts, convs_only=False) -> dict:
    """vDNN's decisions: every layer's input (``convs_only``: every convolution's input) offloaded
    while its last forward reader runs and freed after it, prefetched one backward layer ahead of
    its first backward use."""
    f = Layers(facts)
    ev = {}
    for s in f.forward:
        if convs_only and s.node.op.name not in CONV_OPS:
            continue
        for u in s.ins:
            if u is not None and not f.schedule.tensors[u].persistent:
                ev.update(f.offload(u, early=True))
    return ev


def just_in_time(evictions) -> dict:
    """``evictions`` with every prefetch issued just before the step that needs it."""
    return {k: dataclasses.replace(e, lead=0) if e.kind == "offload" else e for k, e in evictions.items()}


class Prefetching:
    """One set of offloads, lowered once with every prefetch just in time: the most arena bytes of
    each schedule step (``curve``, with ``algos``' workspaces), from which :meth:`fit` times the
    prefetches for any limit and :meth:`with_algorithms` gives the curve with other algorithms (a
    workspace lives only during its own step) without lowering again."""

    def __init__(self, facts, evictions, algos):
        schedule, touch = facts.schedule, facts.touch
        self.schedule, self.evictions, self.touch, self.algos = schedule, evictions, touch, algos
        self.curve = step_curve(lower(schedule, just_in_time(evictions), facts, algos), len(schedule.steps))
        self.offloads = sorted((touch[t][g + 1], t, g) for (t, g), e in evictions.items() if e.kind == "offload")

    def with_algorithms(self, algos) -> np.ndarray:
        curve, steps, tensors = self.curve.copy(), self.schedule.steps, self.schedule.tensors
        for i, a in algos.items():
            curve[i] += aligned(a.workspace) - aligned(workspace_bytes(steps[i], self.algos, tensors))
        return curve

    def fit(self, limit, curve=None) -> tuple:
        """(the evictions with each prefetch issued as early as its ``lead`` asks where the arena has
        room for it from then on within ``limit``, else as early as it has - at the latest, just
        before the step that needs it: a prefetch waits for the memory it lands in - and the most
        bytes a step then holds). The prefetches needed first get the room first (ties: tensor id).
        ``curve``: this curve with other algorithms (:meth:`with_algorithms`)."""
        curve = (self.curve if curve is None else curve).copy()
        out = just_in_time(self.evictions)
        for b, t, g in self.offloads:
            ask = min(self.evictions[t, g].lead, b - self.touch[t][g] - 1)   # (a prefetch follows its offload)
            size, lead = int(self.schedule.tensor_bytes[t]), 0
            while lead < ask and curve[b - lead - 1] + size <= limit:
                lead += 1
            curve[b - lead:b] += size
            out[t, g] = dataclasses.replace(self.evictions[t, g], lead=lead)
        return out, int(curve.max(initial=0))


def memory_optimal(options, algos) -> dict:
    """``algos`` with every step that has options given its smallest workspace (the faster on a tie):
    the paper's "memory-optimal" configuration, cuDNN's no-workspace preference."""
    return {**algos, **{i: min(opts, key=lambda p: (p[1].workspace, p[0]))[1] for i, opts in options.items()}}


class VDNN(_Baseline):
    """vDNN_all / vDNN_conv (Rhu et al., "vDNN: Virtualized Deep Neural Networks for Scalable,
    Memory-Efficient Neural Network Design", MICRO 2016).

    Rule: the input feature map X of every layer (vDNN_all) or of every convolution (vDNN_conv) is
    offloaded while the last layer that reads it in the forward runs (the copy overlaps that
    layer; X is read-only there) and released once both are done; it is prefetched as the
    backward of the next layer in the network starts, so that it arrives for its own layer's
    backward. A layer is the paper's: a step with the activations that run in place after it
    (Caffe's and Torch's ReLU). Chosen for values with several consumers (the paper's nets are
    chains): such a value is in the set if any of its consumers is, is offloaded with the last of
    them, and is prefetched one layer ahead of the first backward that reads it. Only inputs that
    a backward reads are offloaded (a ReLU's input is dead after its forward). Algorithms: the
    fastest, the paper's "performance-optimal" configuration (p), where the plan fits with them;
    else every convolution's smallest workspace, its "memory-optimal" configuration (m), with
    which the paper trains VGG-16 at batch 256 in 12 GB. None if neither fits.

    Where minidnn differs: the paper's ReLU runs in place, so its backward holds two feature maps;
    here it holds three (output, output gradient, input gradient), and the input of the
    convolution before it, prefetched during that backward, would sit beside them (VGG-16 b256:
    four 3.06 GiB maps, 12.25 GiB, where 12 GiB less the weights, gradients and momentum leaves
    10.45). A prefetch that the arena cannot hold one layer ahead is issued as soon as it can
    (:meth:`Prefetching.fit`), at the latest just before its own layer: the wait the paper's
    runtime allocator would impose, and a stall the paper does not have.
    """

    def __init__(self, convs_only):
        self.convs_only = convs_only
        self.name = "vdnn_conv" if convs_only else "vdnn_all"

    def evictions(self, facts, limit, cost, algos=None):
        return self.choose(facts, limit, cost, {}, algos or {})[0]

    def choose(self, facts, limit, cost, options, algos):
        return self.chooser(facts, cost, options, algos)(limit)

    def chooser(self, facts, cost, options, algos):
        timing = Prefetching(facts, layerwise_offloads(facts, self.convs_only), algos)
        slow = memory_optimal(options, algos)
        configs = [(algos, timing.curve), (slow, timing.with_algorithms(slow))]

        def choose(limit):
            for chosen, curve in configs:
                fitted, need = timing.fit(limit, curve)
                if need <= limit:
                    return fitted, chosen
            return None, None
        return choose


class VDNNDynamic(_Baseline):
    """vDNN_dyn (Rhu et al. 2016, section III-C): the first of vDNN_none, vDNN_conv, vDNN_all that fits
    with the fastest algorithms; failing that, vDNN_conv then vDNN_all with the paper's greedy
    per-layer algorithm downgrade (the layer at the memory peak gets its next-smaller workspace,
    until the plan fits or nothing is left to downgrade - vDNN_all with memory-optimal algorithms,
    the configuration the paper first checks the network trains with). Prefetches as in
    :class:`VDNN`: one layer ahead where the arena holds them; the downgrade is decided with every
    prefetch just in time (a faster algorithm comes before an earlier prefetch), then the
    prefetches get the room that is left."""

    name = "vdnn_dyn"

    def evictions(self, facts, limit, cost, algos=None):
        return self.choose(facts, limit, cost, {}, algos or {})[0]

    def choose(self, facts, limit, cost, options, algos):
        return self.chooser(facts, cost, options, algos)(limit)

    def chooser(self, facts, cost, options, algos):
        tries = [Prefetching(facts, ev, algos) for ev in
                 ({}, layerwise_offloads(facts, True), layerwise_offloads(facts, False))]
        steps = range(len(facts.schedule.steps))

        def choose(limit):
            for timing in tries:
                fitted, need = timing.fit(limit)
                if need <= limit:
                    return fitted, algos
            for timing in tries[1:]:
                curve = timing.curve.copy()
                chosen = downgrade(curve, steps, options, algos, limit)
                if chosen is not None:
                    return timing.fit(limit, curve)[0], chosen
            return None, None
        return choose


# -- Chen et al.: sublinear memory by checkpointing --------------------------------------
class CheckpointSqrt(_Baseline):
    """Chen, Xu, Zhang, Guestrin, "Training Deep Nets with Sublinear Memory Cost" (arXiv 2016).

    Rule: the n forward layers are cut into segments of about k = sqrt(n); the values that cross a
    cut are kept, everything produced inside a segment is dropped after the forward and recomputed
    from the kept values for the backward. Details the paper leaves open, chosen here: for a graph
    that is not a chain the paper cuts at articulation points; each cut is placed within k/2 of its
    ideal position where the fewest bytes cross it (a single tensor where the graph has an
    articulation point, several in a dense block); the values crossing a cut are the checkpoints.
    Outputs of non-recomputable layers (dropout: a new mask) stay on the device - the paper's
    scheme is recompute-only, no host memory. Budget-independent; None if it does not fit.
    Recomputation is memory-centric (see the module notes), so time can exceed the paper's one
    extra forward.
    """

    name = "checkpoint_sqrt"

    def evictions(self, facts, limit, cost, algos=None):
        ev = self.decisions(facts)
        try:
            need = live_bytes(facts, ev, algos)
        except ValueError:       # a dropped value's chain starts at a value no longer on the device
            return None          # (a graph input after its last use): the rule has no plan here
        return ev if need <= limit else None

    def rework(self, facts) -> float:
        """About how many recompute steps the segments cost per schedule step, lowered without a
        horizon (each value the backward reads restores its chain from the segment's start): the
        square of each segment's forward length, halved, over the schedule's length."""
        cuts, _ = self.cuts(facts)
        ends = [s.index for s in facts.forward]
        if not ends:
            return 0.0
        bounds = [ends[0]] + cuts + [ends[-1]]
        return sum((b - a) ** 2 / 2 for a, b in zip(bounds, bounds[1:])) / len(facts.schedule.steps)

    @staticmethod
    def cuts(facts):
        """Schedule indices of the forward steps after which a segment ends, and the bytes crossing
        after each forward step."""
        f, schedule, touch = Layers(facts), facts.schedule, facts.touch
        fwd = [s.index for s in f.forward]
        n = len(fwd)
        diff = np.zeros(len(schedule.steps) + 1, np.int64)
        for t, ts in touch.items():
            last = bisect.bisect_right(ts, f.end) - 1
            if last > 0:                          # alive from its first touch to its last forward one
                diff[ts[0]] += aligned(schedule.tensors[t].nbytes)
                diff[ts[last]] -= aligned(schedule.tensors[t].nbytes)
        crossing = np.cumsum(diff[:-1])
        k = max(1, round(math.sqrt(n)))
        cuts, pos = [], -1
        while pos + k < n - 1:
            lo, hi = pos + max(1, (k + 1) // 2), min(n - 2, pos + k + k // 2)
            ideal = pos + k
            best = min(range(lo, hi + 1), key=lambda p: (crossing[fwd[p]], abs(p - ideal)))
            cuts.append(fwd[best])
            pos = best
        return cuts, crossing

    def decisions(self, facts) -> dict:
        f, touch = Layers(facts), facts.touch
        cuts, _ = self.cuts(facts)
        kept = set()
        for c in cuts:
            for t, ts in touch.items():
                if ts[0] <= c < ts[bisect.bisect_right(ts, f.end) - 1]:
                    kept.add(t)
        ev = {}
        for t, src in f.producer.items():
            g = f.crossing(t)
            if g is not None and t not in kept and src.node.op.recomputable:
                ev[(t, g)] = Evict("recompute")
        return ev


# -- SuperNeurons ----------------------------------------------------------------------------
class SuperNeurons(_Baseline):
    """Wang et al., "SuperNeurons: Dynamic GPU Memory Management for Training Deep Neural Networks"
    (PPoPP 2018): liveness analysis + the Unified Tensor Pool's offload of convolution outputs
    (their transfers hide behind the convolutions) + cost-aware recomputation of cheap layers.

    Rule: every convolution's output is offloaded after its last forward use and prefetched one
    backward layer ahead of the first backward that needs it (read it, or recompute from it); the
    outputs of the cheap layers (BatchNorm, activations, pooling) are dropped after the forward
    and recomputed from the nearest convolution output; everything else (adds, concatenations,
    linear layers, dropout) is freed by liveness only. Chosen where the paper leaves it open or
    where minidnn's graph differs from its Caffe-style one:

    - an activation that is a convolution's only consumer runs in place in Caffe, so its output
      *is* the convolution's output: that output is the one offloaded (VGG's conv+ReLU);
    - a cheap output is dropped only if it can be recomputed from tensors on the device or on the
      host through cheap layers alone (never re-running a convolution); otherwise it stays;
    - add and concatenation are not "cheap" (the paper lists POOL, ACT, BN, LRN); BatchNorm's
      per-channel statistics stay (only feature maps are recomputed);
    - recomputation is memory-centric (the paper picks per segment; see the module notes).

    Budget-independent like the paper's policy; with several convolution algorithms, the one at
    the peak gets a smaller workspace until the plan fits (the paper's dynamic workspace).
    """

    name = "superneurons"

    def evictions(self, facts, limit, cost, algos=None):
        return self.choose(facts, limit, cost, {}, algos or {})[0]

    def choose(self, facts, limit, cost, options, algos):
        f, schedule, touch = Layers(facts), facts.schedule, facts.touch
        consumers = f.consumers
        checkpoints = set()
        for s in f.forward:
            if s.node.op.name in CONV_OPS:
                t = s.outs[0]
                while len(consumers[t]) == 1 and consumers[t][0].node.op.name in ACTIVATIONS:
                    t = consumers[t][0].outs[0]
                checkpoints.add(t)
        ev, dropped = {}, set()

        def cheaply(t, at, depth=0):
            """Can ``t`` be brought back at step ``at`` through cheap layers from what is kept?"""
            src = f.producer.get(t)
            if src is None or src.node.op.name not in CHEAP_OPS or not src.node.op.recomputable or depth > 8:
                return False
            for u in src.ins:
                if u is None or schedule.tensors[u].persistent or (u, f.crossing(u)) in ev and u not in dropped:
                    continue                              # persistent, or offloaded
                ts = touch[u]
                if u not in dropped and ts[0] <= at <= ts[-1]:
                    continue                              # on the device then
                if not cheaply(u, at, depth + 1):
                    return False
            return True

        for s in f.forward:
            for t in s.outs:
                g = f.crossing(t)
                if g is None:
                    continue
                if t in checkpoints:
                    ev.update(f.offload(t))
                elif (s.node.op.name in CHEAP_OPS and _feature_map(schedule, s, t)
                      and cheaply(t, touch[t][g + 1])):
                    ev[(t, g)] = Evict("recompute")
                    dropped.add(t)
        self._prefetch_for_recompute(f, ev)
        chosen = downgrade_at_peak(facts, ev, options, algos, limit)
        return (None, None) if chosen is None else (ev, chosen)

    @staticmethod
    def _prefetch_for_recompute(f, ev):
        """A convolution output is the checkpoint its cheap successors are recomputed from: prefetch
        it one layer ahead of the first such recomputation, not of its own backward (else that
        recomputation would wait for a copy issued on the spot)."""
        offloaded = {t: g for (t, g), e in ev.items() if e.kind == "offload"}
        dropped = {t for (t, _), e in ev.items() if e.kind == "recompute"}
        need = {}

        def walk(t, at, depth=0):
            src = f.producer.get(t)
            for u in (src.ins if src is not None and depth < 8 else ()):
                if u is None or f.schedule.tensors[u].persistent:
                    continue
                if u in offloaded:
                    need[u] = min(need.get(u, at), at)
                elif u in dropped or f.touch[u][-1] < at:     # not on the device then: recomputed too
                    walk(u, at, depth + 1)

        for (t, g), e in ev.items():
            if e.kind == "recompute":
                walk(t, f.touch[t][g + 1])
        for t, at in need.items():
            g = offloaded[t]
            b = f.touch[t][g + 1]
            if at < b:
                ev[(t, g)] = Evict("offload", delay=1, lead=b - at + f.one_layer_ahead(at))


# -- moDNN -----------------------------------------------------------------------------------
class MoDNN(_Baseline):
    """Chen, Chen, Hu, "moDNN: Memory Optimal DNN Training on GPUs" (DATE 2018): offload/prefetch
    heuristics with convolution algorithm selection (its sub-batching is the trainer's, see the
    module notes).

    Rule, as implemented: at the step where the most bytes are live, offload the largest feature
    map idle across it (its forward-to-backward gap; ties: the one produced earliest, whose long
    gap hides its copy best); if none is left there, give that step's convolution its smallest
    workspace. Repeat until the budget fits. Then spend what is left of the budget: upgrade
    convolutions back to faster algorithms where the memory allows, start each copy out beside
    the step that last reads the tensor where that step only reads it (the paper overlaps each
    transfer with computation), hold the buffer until its copy is hidden and issue each prefetch
    as early as memory allows (the tensors needed first in the backward get the room first),
    unless the placed plan would then exceed the budget. Swap-only: moDNN does not recompute.

    Where its figure differs: on VGG-16 b256 in 12 GiB (titanx-12gb) the ReLU after the first
    block's second convolution is not in place (module notes): its backward holds 9.18 GiB of the
    10.45 GiB arena, so that convolution's input (3.06 GiB) is off the device then and its
    prefetch (0.34 s over PCIe 3) starts once that backward is over, with nothing left to hide it:
    every offload-only plan waits 5.4% of the 6.37 s step there, where the paper's does not.
    """

    name = "modnn"

    def evictions(self, facts, limit, cost, algos=None):
        return self.choose(facts, limit, cost, {}, algos or {})[0]

    def choose(self, facts, limit, cost, options, algos):
        f, schedule, touch = Layers(facts), facts.schedule, facts.touch
        cur = dict(algos)
        curve = approximate_curve(facts, cur)
        rows = []                                   # (t, gap, a, b, size)
        for t, _ in touch.ordered():
            g = f.crossing(t)
            if g is not None:
                rows.append((t, g, touch[t][g], touch[t][g + 1], aligned(schedule.tensors[t].nbytes)))
        taken = {}
        while True:
            s = int(np.argmax(curve))
            if curve[s] <= limit:
                break
            idle = [r for r in rows if r[2] < s < r[3] and (r[0], r[1]) not in taken]
            if idle:
                r = max(idle, key=lambda r: (r[4], -r[2]))
                taken[(r[0], r[1])] = r
                curve[r[2] + 1:r[3]] -= r[4]
                continue
            if s in options:
                a = min(options[s], key=lambda p: (p[1].workspace, p[0]))[1]
                ws = aligned(cur.setdefault(s, options[s][0][1]).workspace) - aligned(a.workspace)
                if ws > 0:
                    cur[s] = a
                    curve[s] -= ws
                    continue
            return None, None
        secs = [cost.step_seconds(schedule, st, cur.get(st.index)) for st in schedule.steps]
        for i, opts in options.items():              # faster algorithms where memory allows
            cur.setdefault(i, opts[0][1])
            for sec, a in opts:
                grow = aligned(a.workspace) - aligned(cur[i].workspace)
                if sec < secs[i] and curve[i] + grow <= limit:
                    cur[i], curve[i], secs[i] = a, curve[i] + grow, sec
                    break
        ev = {}
        for t, g, a, b, size in sorted(taken.values(), key=lambda r: r[3]):
            lead = 0
            while b - lead - 1 > a + 1 and curve[b - lead - 1] + size <= limit:
                lead += 1
                curve[b - lead] += size
            early = f.only_reads(t, a)                # the copy overlaps the last forward use
            need, delay, acc = cost.transfer_seconds(schedule.tensors[t].nbytes), 0, secs[a] if early else 0.0
            while acc < need and a + delay + 1 < b - lead - 1 and curve[a + delay + 1] + size <= limit:
                delay += 1
                acc += secs[a + delay]
                curve[a + delay] += size
            ev[(t, g)] = Evict("offload", delay=delay, lead=lead, early=early)
        if place_program(lower(schedule, ev, facts, cur), limit)[1] > limit:
            # early prefetches filled the budget and placement fragments it: copies issued just in time
            ev = {k: Evict("offload", early=e.early) for k, e in ev.items()}
        return ev, cur


class Recorded:
    """A policy passed through, remembering what it returned. ``owns(plan)`` tells its own plan from
    the one ``plan_memory`` falls back to when a policy cannot meet the budget (the planner's
    everything-evicted minimum, which carries the policy's name)."""

    def __init__(self, policy):
        self.policy, self.name, self.returned = policy, policy.name, []

    def chooser(self, *a):
        choose = self.policy.chooser(*a)
        return lambda limit: self._keep(choose(limit), 0)

    def _keep(self, out, idx):
        ev = out if idx is None else out[idx]
        if ev is not None:
            self.returned.append({k: e.kind for k, e in ev.items()})
        return out

    def owns(self, plan) -> bool:
        return not plan.evictions or {k: e.kind for k, e in plan.evictions.items()} in self.returned
