"""Lowering: a schedule plus eviction decisions in, the executable step list out.

A tensor of the schedule is touched at a sorted list of steps; between two
consecutive touches lies a *gap*. A decision may evict a tensor for a gap:

- ``offload``: copy it to the host store after the touch that opens the gap
  (once; a copy stays valid until the tensor is written again), free the
  device buffer ``delay`` schedule steps later (when the copy is done), and
  prefetch it back ``lead`` schedule steps before the touch that closes the gap;
  ``early``: the copy is issued as that touch starts (a touch that only reads
  the tensor), so it overlaps that step, and the buffer is freed after it
  (vDNN's offload of a layer's input, overlapping the layer's forward);
- ``recompute``: drop it right after the touch, and run its producer's forward
  again just before the next touch (restoring that producer's inputs the same
  way, so segments of cheap ops are recomputed together).

The result is a list of steps (the schedule's, with ``offload``, ``prefetch``
and ``recompute`` steps inserted) and *residencies*: the intervals of the new
step list during which a tensor occupies device memory. Each residency is one
buffer for the placement; a tensor may have several.
"""
from __future__ import annotations

import bisect
import itertools
import math
import operator
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..graph import Node, Spec
from ..schedule import WORKSPACE, Step, Tensor, aligned
from .facts import Facts, Touches, arena_touches


@dataclass(frozen=True)
class Evict:
    kind: str          # "offload" or "recompute"
    delay: int = 0     # offload: schedule steps the device copy is held after the offload is issued
    lead: int = 0      # offload: schedule steps before the next touch at which the prefetch is issued
    early: bool = False  # offload: issued as the touch that opens the gap starts, not after it


@dataclass(slots=True)
class Residency:
    tensor: int
    start: int         # index in Program.steps
    end: int
    origin: str        # "compute", "prefetch" or "recompute"
    wait_offload: int = None   # step index of the offload whose completion the free waits for
    delay: int = 0


@dataclass
class Program:
    steps: list
    tensors: list
    residencies: list
    host_slots: dict = field(default_factory=dict)   # tensor id -> host store offset
    host_bytes: int = 0
    origin: list = field(default_factory=list)  # step index -> the schedule step it runs (-1 for copies)
    tensor_bytes: np.ndarray = None   # aligned bytes by tensor id, set by the lowering
    resume: object = None             # a Resume: where a lowering of other decisions may start from this one
    lineage: object = None            # a Lineage: the Program this one's lowering resumed from, and what it shares
    replay: object = None             # the simulator's checkpoints of its last replay (simulator.simulate)

    @cached_property
    def buffers(self) -> tuple:
        """(starts, ends, aligned bytes) of the residencies, as int64 arrays. Computed once: a
        Program's residencies do not change after lowering."""
        res, n = self.residencies, len(self.residencies)
        arrays = (np.fromiter((r.start for r in res), np.int64, n), np.fromiter((r.end for r in res), np.int64, n),
                  self.tensor_bytes[np.fromiter((r.tensor for r in res), np.int64, n)])
        for a in arrays:
            a.flags.writeable = False
        return arrays


class _Shared:
    """What every lowering of one schedule reads and none changes, derived once from its
    :class:`~.facts.Facts` and kept there (a planning run lowers the same schedule hundreds of
    times): what each step touches of the arena, what it closes (the arena tensors it touches last,
    not kept to the end), the chains the lowering's restores walked (:meth:`_Lowering.restore`) and
    the recomputations' labels and workspaces."""

    def __init__(self, facts):
        touch, keep = facts.touch, facts.keep
        self.arena = touch.by_step if isinstance(touch, Touches) else arena_touches(facts.schedule)
        self.closes = [tuple([t for t in used if touch[t][-1] == i and t not in keep])
                       for i, used in enumerate(self.arena)]
        self.chains = {}       # (horizon, step, missing) -> [(what the walk asked and was told, its chain, drops)]
        self.recomputes = {}   # (schedule step, workspace, label, algorithm) -> (label, workspace bytes, algorithm)

    @staticmethod
    def of(facts):
        """``facts``' _Shared (made on the first lowering that reads it)."""
        shared = facts.__dict__.get("_lowering")
        if shared is None:
            shared = facts.__dict__["_lowering"] = _Shared(facts)
        return shared


@dataclass(frozen=True)
class Checkpoint:
    """The lowering's state as schedule step ``step`` begins: how long its lists were, its open
    residencies (tensor -> residency index) with their ends then, and the host store."""

    step: int
    steps: int
    residencies: int
    tensors: int
    offloads: int
    cur: dict
    ends: tuple
    host_valid: frozenset
    host_slots: int          # how many of the final program's host slots were taken then
    host_bytes: int


@dataclass(frozen=True)
class Lineage:
    """What a resumed lowering shares with the Program it resumed from (``base``, a weak reference:
    a Program does not keep its ancestors alive): its first ``steps`` program steps are that
    program's, the same Step objects (the simulator starts from its replay of them)."""

    base: object
    steps: int


@dataclass(frozen=True)
class Resume:
    """What lowering other decisions from one of a Program's checkpoints needs: the decisions it was
    lowered from, the program step of each schedule step (``at``), each offload that freed its
    buffer after a copy (residency index, its end when freed, before any hold; the schedule step it
    follows; its decision's key), and the checkpoints."""

    evictions: dict
    algos: dict
    keep_within: int
    at: list
    offloads: list
    checkpoints: tuple


def shared_steps(touch, old, new, n) -> int:
    """The schedule steps (from the first) that lowering the decisions ``new`` runs exactly as
    lowering ``old`` did, up to the holds of their offloads (``delay``, applied after the pass): the
    first step that a decision in one and not the other, or another kind, or an offload issued
    elsewhere or prefetched before another step, acts at (``n``: none)."""
    first = n
    for key, ev in new.items():
        was = old.get(key)
        if was == ev:
            continue
        ts = touch[key[0]]
        a = ts[key[1]]
        if was is None or was.kind != ev.kind or was.early != ev.early or ev.kind != "offload":
            first = min(first, a)
            continue
        b = ts[key[1] + 1]
        f, g = max(a + 1, b - was.lead), max(a + 1, b - ev.lead)
        if f != g:
            first = min(first, f, g)
    for key in old.keys() - new.keys():
        first = min(first, touch[key[0]][key[1]])
    return first


def lower(schedule, evictions: dict, facts=None, algos=None, keep_within=0, base=None, checkpoints=0) -> Program:
    """Build the Program for ``evictions``: {(tensor id, gap index): Evict}, running each
    schedule step i with algorithm ``algos[i]`` (an ops.base.Algo) where given. ``facts``: the
    schedule's facts.Facts (or only its touch map; None: derived here).

    A recomputation whose input was dropped too recomputes that input first (a chain). The
    input is then dropped again, unless its own next use is at most ``keep_within`` schedule
    steps away: then it stays until that use, which saves recomputing the chain once more
    (a segment of recomputed layers is recomputed once, not once per layer, at the cost of
    holding it through its backward).

    ``checkpoints``: how many times (evenly over the schedule) the pass records its state, so that a
    later lowering may start from it; ``base``: such a Program of this schedule and touches, whose
    pass the lowering of ``evictions`` repeats from its last checkpoint that :func:`shared_steps`
    allows (with the same algorithms and horizon) instead of from the first step (the Program's
    ``lineage`` says so). Lowerings that share ``facts`` also share the chains their restores walk
    (:meth:`_Lowering.restore`). The Program is the same either way
    (tests/test_planning_time_lowering.py, tests/test_planning_time_replay.py)."""
    facts = facts if isinstance(facts, Facts) else Facts(schedule, facts)
    return _Lowering(schedule, evictions, facts, algos or {}, keep_within, checkpoints).run(base)


def recompute_seconds(t, at, touch, producer, secs, tensors) -> float:
    """The seconds (``secs``: by schedule step) the lowering takes to restore ``t`` by recomputation
    just before schedule step ``at``, nothing else evicted: the chain :func:`restore_order` walks
    for it (its producer and, for each input not alive across ``at``, that input's restoring in
    turn, each producer once, fused as the lowering fuses them), summed as the simulator costs it.
    A join's other inputs may need copies this does not count. inf where it cannot: a value on
    the way that is not recomputable."""
    def present(u):
        ts = touch.get(u)
        return ts is not None and ts[0] <= at <= ts[-1]
    try:
        order = restore_order([t], {t}, present, lambda u: False, producer, tensors, lambda u: True)
    except ValueError:
        return math.inf
    return sum(secs[what.index] for _, what in order)


def workspace_bytes(step, algos, tensors) -> int:
    """The workspace bytes (unaligned) ``step`` runs with: its chosen algorithm's, else its own."""
    algo = algos.get(step.index)
    return algo.workspace if algo is not None else (tensors[step.ws].nbytes if step.ws is not None else 0)


def restore_order(missing, needed, present, on_host, producer, tensors, droppable) -> list:
    """The chain that brings ``missing`` back before a step that touches ``needed``: a list of
    ("prefetch", tensor), ("recompute", Step) and ("fused", Step) in the order the lowering runs
    them. ``present(u)``: whether u is on the device before the chain; ``on_host(u)``: whether the
    host store holds it (then it is prefetched, else its producer recomputed, and so on back to
    what is on the device or the host); ``droppable(u)``: whether a restored value is dropped
    after its last use in the chain. One walk for the lowering and for the planner's memory model.

    Each producer runs once, in dependency order. (Dropping a value that two branches of the chain
    read after the first would restore it once per residual join: 2^joins times in a segment of
    residual blocks.) Raises ValueError for a value neither on the host nor recomputable."""
    order, seen, path = [], set(), set()
    todo = [(t, False) for t in reversed(missing)]   # a depth-first walk: chains can be deep
    while todo:
        t, inputs_done = todo.pop()
        if inputs_done:                   # every dropped input is restored: recompute it
            path.discard(t)
            src = producer[t]
            order.append(("recompute", src))
            seen.update(src.outs)
            continue
        if t in seen:
            continue
        if on_host(t):
            order.append(("prefetch", t))
            seen.add(t)
            continue
        src = producer.get(t)
        if src is None or not src.node.op.recomputable or t in path:
            raise ValueError(f"cannot restore {tensors[t].name}: neither on the host nor recomputable")
        path.add(t)
        todo.append((t, True))
        # the input produced first is restored first: its chain is the longer one, and a residual
        # join's other input (a few steps back) then waits on the device one tensor at a time, not
        # one per block of the chain
        deps = [u for u in dict.fromkeys(src.ins) if u is not None and not tensors[u].persistent
                and u not in seen and not present(u)]
        if len(deps) > 1:
            deps.sort(key=lambda u: producer[u].index if u in producer else -1, reverse=True)
        todo.extend((u, False) for u in deps)
    return _fuse(order, needed, droppable)


def _fuse(order, needed, droppable) -> list:
    """``order`` with each recomputation whose first output only one later recomputation of the
    chain reads (once; not the current step, nor a value that stays) merged into that one as a
    step of the fused op (:meth:`Op.fused`), which never writes the output; merged steps merge on
    (BatchNorm, add, ReLU). A merged step stands for the first op merged into (its cost: one pass
    over that op's bytes)."""
    out, dead = list(order), set()
    readers = defaultdict(list)           # tensor -> the positions of the chain steps that read it
    for j, (kind, w) in enumerate(out):
        if kind != "prefetch":
            for u in dict.fromkeys(w.ins):
                readers[u].append(j)
    for k, (kind, a) in enumerate(out):
        y = a.outs[0] if kind != "prefetch" and a.outs else None
        rs = readers.get(y, ())
        j = rs[0] if len(rs) == 1 else None              # its one reader in the chain
        b = out[j][1] if j is not None else None
        op = a.node.op.fused(b.node.op) if b is not None and b.ins.count(y) == 1 else None
        if (op is None or y in needed or not droppable(y)
                or any(u in out[i][1].ins for i in range(k + 1, j) if out[i][0] != "prefetch"
                       for u in a.outs[1:])):       # its other outputs are not wanted before it
            continue
        others = [u for u in b.ins if u != y]
        node = Node(a.node.id, op, a.node.inputs, b.node.outputs[:1] + a.node.outputs[1:], a.node.path)
        out[j] = ("fused", Step(a.index if kind == "fused" else b.index, b.kind, f"{a.label}+{b.node.op.name}",
                                node=node, reads=a.reads + others, ins=a.ins + others,
                                outs=b.outs[:1] + a.outs[1:], ws=a.ws, flops=a.flops + b.flops))
        dead.add(k)
    return [e for k, e in enumerate(out) if k not in dead]


def restore_footprint(order, present, droppable, nbytes, ws_bytes, secs) -> tuple:
    """(the most bytes ``order``'s chain holds at once on top of what is on the device before it,
    the seconds of its recomputations): what the lowering's steps for it hold, step by step.
    ``nbytes``: aligned bytes by tensor id; ``ws_bytes(step)``: a recomputation's aligned
    workspace; ``secs``: seconds by schedule step."""
    last, opened = {}, {}                 # value -> the last chain position reading it / opening it
    for p, (kind, what) in enumerate(order):
        if kind == "prefetch":
            opened[what] = p
            continue
        for u in what.ins:
            if u is not None:
                last[u] = p
        for u in what.outs:
            if u not in opened and not present(u):
                opened[u] = p
    change = np.zeros(len(order) + 1, np.int64)   # bytes opened at a position, dropped after one
    for u, p in opened.items():
        change[p] += nbytes[u]
        if droppable(u):
            change[last.get(u, p) + 1] -= nbytes[u]
    held, peak, seconds = np.cumsum(change[:-1]).tolist(), 0, 0.0
    for p, (kind, what) in enumerate(order):
        if kind == "prefetch":
            peak = max(peak, held[p])
        else:
            peak = max(peak, held[p] + ws_bytes(what))
            seconds += secs[what.index]
    return peak, seconds


# The chain walks kept per restore (one step, the same missing tensors, one horizon) with their
# questions and answers (_Lowering.restore): a trial's lowering asks again what the lowerings of the
# plans it changes asked. GoogLeNet b256 @ 25% on a100, staged as 2 x 128 (1,042 lowerings): 85,818
# walks with none kept, 7,149 keeping one, 6,374 two, 6,078 eight, 6,071 thirty-two.
_CHAIN_WALKS = 8
_end = operator.attrgetter("end")


class _Lowering:
    def __init__(self, schedule, evictions, facts, algos, keep_within=0, checkpoints=0):
        touch = facts.touch
        self.sched, self.touch, self.algos, self.keep_within = schedule, touch, algos, keep_within
        self.evictions = evictions
        n = len(schedule.steps)
        self.stride = max(1, -(-n // checkpoints)) if checkpoints else 0   # schedule steps between checkpoints
        self.checkpoints = []
        self.offloads = []                    # (residency, its end when freed, schedule step, key): see Resume
        self.now = 0                          # the schedule step being lowered
        self.tensors = list(schedule.tensors)
        self.steps, self.res, self.origin = [], [], []
        self.at = []                          # schedule step -> the program step that runs it
        self.holds = []                       # (offloaded residency, the schedule step it is held through)
        self.ws_bytes = []                   # aligned bytes of the workspace tensors added here
        self.cur: dict[int, int] = {}        # tensor id -> index of its open residency
        self.host_valid: set = set()
        self.host_slots: dict = {}
        self.host_bytes = 0
        self.lineage = None
        self.shared = _Shared.of(facts)
        self.arena = self.shared.arena
        self.producer, self.keep_to_end = facts.producer, facts.keep
        self.after = defaultdict(list)        # schedule step -> [(tensor, Evict)] after it
        self.early = defaultdict(list)        # schedule step -> [tensor] whose offload is issued with it
        self.prefetch_at = defaultdict(list)  # schedule step -> [tensor] prefetched before it
        for (t, gap), ev in sorted(evictions.items()):
            a, b = touch[t][gap], touch[t][gap + 1]
            self.after[a].append((t, ev, gap))
            if ev.kind == "offload" and ev.early:
                if t in schedule.steps[a].writes or t in schedule.steps[a].updates:
                    raise ValueError(f"an early offload of {self.tensors[t].name} with step {a}, which writes it")
                self.early[a].append(t)
            if ev.kind == "offload":
                self.prefetch_at[max(a + 1, b - ev.lead)].append(t)

    # -- bookkeeping ----------------------------------------------------------
    def emit(self, step, orig=-1) -> int:
        """Append ``step``, a new Step, as the next program step (running schedule step ``orig``)."""
        step.index = len(self.steps)
        self.steps.append(step)
        self.origin.append(orig)
        return step.index

    def open(self, t, i, how):
        self.cur[t] = len(self.res)
        self.res.append(Residency(t, i, i, how))

    def extend(self, t, i):
        r = self.res[self.cur[t]]
        r.end = max(r.end, i)

    def close(self, t, i) -> Residency:
        r = self.res[self.cur.pop(t)]
        r.end = max(r.end, i)
        return r

    def workspace(self, label, nbytes):
        if not nbytes:
            return None
        self.tensors.append(Tensor(len(self.tensors), f"{label}:workspace", Spec((nbytes,), "uint8"), WORKSPACE))
        self.ws_bytes.append(aligned(nbytes))
        return self.tensors[-1].id

    # -- restoring evicted tensors ----------------------------------------------
    def prefetch(self, t):
        i = self.emit(Step(0, "prefetch", f"prefetch {self.tensors[t].name}", writes=[t], outs=[t]))
        self.open(t, i, "prefetch")

    def restore(self, missing, needed):
        """Bring the tensors ``missing`` back before the current step, by :func:`restore_order`'s
        chain; every value restored on the way is dropped again after its last use in the chain,
        unless :meth:`droppable` says it stays.

        The chain is a function of the step, what is missing, the horizon and the answers of the
        walk's questions (what is on the device, what the host holds): each walk is kept with the
        questions it asked and the answers it got, and a walk whose questions get the same answers
        now is that walk again (it asks them in the same order), so it is not walked again."""
        cur, host = self.cur, self.host_valid
        key = (self.keep_within, self.now, tuple(missing))
        walks = self.shared.chains.get(key)
        for asked, order, drops in walks or ():
            on, off, held, not_held = asked
            if (all(map(cur.__contains__, on)) and cur.keys().isdisjoint(off)
                    and host.issuperset(held) and host.isdisjoint(not_held)):
                break
        else:
            answers = ([], [], [], [])

            def present(u):
                yes = u in cur
                answers[0 if yes else 1].append(u)
                return yes

            def on_host(u):
                yes = u in host
                answers[2 if yes else 3].append(u)
                return yes

            drop = lambda u: self.droppable(u, needed)          # noqa: E731
            order = restore_order(missing, needed, present, on_host, self.producer, self.tensors, drop)
            drops = tuple([u for kind, what in order for u in ([what] if kind == "prefetch" else what.outs)
                           if drop(u)])
            if walks is None:
                walks = self.shared.chains[key] = []
            elif len(walks) >= _CHAIN_WALKS:
                del walks[0]
            walks.append((tuple(map(tuple, answers)), order, drops))
        last = {}                             # restored value -> the last chain step that reads it
        for kind, what in order:
            if kind == "prefetch":
                self.prefetch(what)
                continue
            i = self._recompute(what)
            for u in what.ins:
                if u is not None:
                    last[u] = i
        res = self.res
        for u in drops:                       # the chain's values nobody needs soon are dropped
            k = cur.get(u)
            if k is not None and res[k].origin != "compute":
                self.close(u, last.get(u, res[k].start))

    def _recompute(self, src) -> int:
        """Emit a recomputation of schedule step ``src`` (its inputs on the device); its index."""
        algo = self.algos.get(src.index)
        key = (src.index, src.ws, src.label, algo)
        made = self.shared.recomputes.get(key)
        if made is None:
            made = self.shared.recomputes[key] = (f"recompute {src.label}",
                                                  workspace_bytes(src, self.algos, self.tensors),
                                                  algo.name if algo else None)
        label, nbytes, name = made
        ws = self.workspace(label, nbytes)
        cur = self.cur
        i = self.emit(Step(0, "recompute", label, node=src.node, reads=list(src.reads),
                           writes=[u for u in src.outs if u not in cur], ins=list(src.ins),
                           outs=list(src.outs), ws=ws, flops=src.flops, algo=name),
                      src.index)
        res = self.res
        if ws is not None:
            res.append(Residency(ws, i, i, "compute"))
        for u in src.ins:
            if u is not None:
                k = cur.get(u)
                if k is not None and res[k].end < i:
                    res[k].end = i
        for u in src.outs:
            k = cur.get(u)
            if k is None:
                cur[u] = len(res)
                res.append(Residency(u, i, i, "recompute"))
            elif res[k].end < i:
                res[k].end = i
        return i

    def droppable(self, u, needed) -> bool:
        """Whether a value restored for a chain is dropped after its last use there: unless the
        current step needs it or its own next use is within ``keep_within`` steps."""
        ts = self.touch[u]
        k = bisect.bisect_right(ts, self.now)
        return u not in needed and (k == len(ts) or ts[k] - self.now > self.keep_within)

    # -- resuming ---------------------------------------------------------------
    def checkpoint(self, step):
        cur = dict(self.cur)
        ends = tuple(map(_end, map(self.res.__getitem__, cur.values())))
        # (the host store only grows: its first len(host_slots) slots then are the final program's)
        self.checkpoints.append(Checkpoint(step, len(self.steps), len(self.res), len(self.tensors),
                                           len(self.offloads), cur, ends, frozenset(self.host_valid),
                                           len(self.host_slots), self.host_bytes))

    def resume(self, base) -> int:
        """Take the state of ``base``'s (a Program's) last checkpoint that lowering these decisions
        shares; the schedule step to go on from (0: none shared)."""
        r = base.resume if base is not None else None
        if r is None or r.keep_within != self.keep_within or r.algos != self.algos:
            return 0
        shared = shared_steps(self.touch, r.evictions, self.evictions, len(self.sched.steps))
        at = bisect.bisect_right([c.step for c in r.checkpoints], shared) - 1
        if at < 0:
            return 0
        c = r.checkpoints[at]
        self.checkpoints = list(r.checkpoints[:at + 1])
        self.steps, self.origin, self.at = base.steps[:c.steps], base.origin[:c.steps], r.at[:c.step]
        self.tensors = base.tensors[:c.tensors]
        self.ws_bytes = base.tensor_bytes[len(self.sched.tensors):c.tensors].tolist()
        res = self.res = base.residencies[:c.residencies]
        for k, end in zip(c.cur.values(), c.ends):      # open then: their own copies, as they were then
            q = res[k]
            res[k] = Residency(q.tensor, q.start, end, q.origin)
        self.offloads = r.offloads[:c.offloads]
        for k, end, a, key in self.offloads:            # freed after a copy: held as these decisions hold them
            q, delay = res[k], self.evictions[key].delay
            res[k] = Residency(q.tensor, q.start, end, q.origin, q.wait_offload, delay)
            if delay:
                self.holds.append((res[k], a + delay))
        self.cur, self.host_valid = dict(c.cur), set(c.host_valid)
        self.host_slots = dict(itertools.islice(base.host_slots.items(), c.host_slots))
        self.host_bytes = c.host_bytes
        self.lineage = Lineage(weakref.ref(base), c.steps)
        return c.step

    # -- the pass -------------------------------------------------------------
    def run(self, base=None) -> Program:
        start = self.resume(base)
        tensors, cur, res, steps, origin, at = self.tensors, self.cur, self.res, self.steps, self.origin, self.at
        algos, after, prefetch_at = self.algos, self.after, self.prefetch_at
        early, host_valid, closes = self.early, self.host_valid, self.shared.closes
        arena = self.arena
        stride = self.stride
        new_step = Step.__new__
        for s, touched in zip(self.sched.steps[start:], arena[start:]):
            now = self.now = s.index
            if stride and now % stride == 0 and now > start:
                self.checkpoint(now)
            if now in prefetch_at:
                for t in prefetch_at[now]:
                    if t not in cur:
                        self.prefetch(t)
            missing = [t for t in touched if t not in cur and t not in s.writes and t != s.ws]
            if missing:
                self.restore(missing, set(touched))
            issued = ({t: self.issue(t) for t in early[now] if t not in host_valid} if now in early else None)
            # the schedule step renumbered: a shallow copy (its __dict__ copied; ~2x cheaper than the
            # constructor, ~20x than replace())
            i = len(steps)
            new = new_step(Step)
            new.__dict__.update(s.__dict__)
            new.index = i
            steps.append(new)
            origin.append(now)
            algo = algos.get(now)
            if algo is not None:              # the chosen algorithm brings its own workspace
                touched = [t for t in touched if t != s.ws]
                ws = new.ws = self.workspace(s.label, algo.workspace)
                new.algo = algo.name
                if ws is not None:
                    res.append(Residency(ws, i, i, "compute"))
            at.append(i)
            for t in touched:                 # open or extend (i is the latest step): inlined, the hot loop
                k = cur.get(t)
                if k is None:
                    cur[t] = len(res)
                    res.append(Residency(t, i, i, "compute"))
                else:
                    res[k].end = i
            if s.writes or s.updates:
                host_valid.difference_update(s.writes)
                host_valid.difference_update(s.updates)
            if now in after:
                for t, ev, gap in after[now]:
                    if ev.kind == "offload":
                        self.offload(t, i, ev, issued.get(t) if issued else None, gap)
                    else:
                        self.close(t, i)
            for t in closes[now]:             # close (its residency ends at i already) after the last use
                if t in cur and (algo is None or t != s.ws):
                    del cur[t]
        last = len(self.steps) - 1
        for t in list(cur):
            self.close(t, last)
        self._apply_delays()
        nbytes = np.concatenate([self.sched.tensor_bytes, np.array(self.ws_bytes, np.int64)])
        resume = (Resume(dict(self.evictions), dict(self.algos), self.keep_within, self.at, self.offloads,
                         tuple(self.checkpoints)) if self.stride else None)
        return Program(self.steps, tensors, self.res, self.host_slots, self.host_bytes, self.origin, nbytes,
                       resume, self.lineage)

    def issue(self, t) -> int:
        """Emit the copy of ``t`` to its host slot (valid until ``t`` is written again); its index."""
        j = self.emit(Step(0, "offload", f"offload {self.tensors[t].name}", reads=[t], ins=[t]))
        self.host_valid.add(t)
        if t not in self.host_slots:
            self.host_slots[t] = self.host_bytes
            self.host_bytes += aligned(self.tensors[t].nbytes)
        return j

    def offload(self, t, i, ev, issued=None, gap=None):
        """Free ``t`` after program step ``i`` (the touch that opens its gap), once its copy is done:
        the copy ``issued`` before that step (an early offload), or one issued now."""
        if issued is None and t in self.host_valid:   # an up-to-date host copy exists: just drop it
            self.close(t, i)
            return
        j = issued if issued is not None else self.issue(t)
        k = self.cur[t]
        r = self.close(t, max(i, j))
        self.offloads.append((k, r.end, self.now, (t, gap)))
        r.wait_offload, r.delay = j, ev.delay
        if ev.delay:
            self.holds.append((r, self.now + ev.delay))

    def _apply_delays(self):
        """Hold an offloaded buffer through the ``delay`` schedule steps after its offload (to the
        end of the last one's own step), so the copy can overlap them."""
        last = len(self.at) - 1
        for r, until in self.holds:
            r.end = max(r.end, self.at[min(until, last)])
