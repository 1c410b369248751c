"""The stage model of the exact reference (optimal.py): its decision variables, what each decision
keeps on the device and runs again, and the memory of every stage; the timeline is in
optimal_time.py. optimal.py's docstring describes the model.

Every expression here is a lower bound on what the lowering does for the same decisions: the
memory of a stage is at most the lowered program's there (so every decision whose plan places
within a limit meets the model's rows), and the time (optimal_time.py) is at most the
simulator's. Where the model cannot tell what the lowering does (the order of a branching
restore chain, whether it fuses a pass), it counts the least.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..schedule import aligned
from .optimal_time import Affine, Compiled, Timeline
from .planner import algorithm_options
from .program import Evict

# The holds and leads an offload may take, as Evict(delay, lead): its copy runs over the ``delay``
# stages after the touch that opens its gap (the value held there; ``early``: issued as that touch
# starts, so it overlaps it too), its prefetch over the ``lead`` stages before the touch that closes
# it; 0 is a copy that compute waits for (the value held by neither). A copy on a GPU profile takes
# several of a small network's layers (a ResNet-20 activation at batch 4 on v100-16gb: 30 us of copy,
# 5-20 us a layer), so one stage each way cannot hide it; the longer ones can, and hold the value
# longer. A hold and a lead that would meet (delay + lead >= the gap's stages) are not offered: the
# prefetch would find the value held.
OFFLOAD_HOLDS = (0, 1, 2, 4, 8)
# The reference's timings: a hold and a lead of the same length; and every hold with every lead, a
# larger decision space that takes the search longer. Each copy out either after the touch that
# opens the gap or, where that touch only reads the value, beside it (early, as vDNN's): a tight
# budget's fastest plans copy beside the touch and free the value as it ends (random DAG 16 (seed 0)
# at 40%: 293.3 us with early copies among every hold and lead, 323.2 us without).
PAIRED_TIMINGS = tuple(Evict("offload", k, k, early=e) for k in OFFLOAD_HOLDS for e in (False, True))
INDEPENDENT_TIMINGS = tuple(Evict("offload", dl, ld, early=e) for dl in OFFLOAD_HOLDS for ld in OFFLOAD_HOLDS
                            for e in (False, True))
RECOMPUTE = Evict("recompute")


def offload_evict(hold, lead) -> Evict:
    """The offload with ``hold`` (delay, early) and ``lead``."""
    delay, early = hold
    return Evict("offload", delay, lead, early=True) if early else Evict("offload", delay, lead)


class Evaluation(NamedTuple):
    """The model's view of given decisions: its ``seconds`` (at most the simulator's), its ``peak``
    arena bytes (at most the lowered program's live peak) and the variable values ``x``."""

    seconds: float
    peak: int
    x: np.ndarray


class Model:
    """The stage model of one schedule and cost model: variables, and expressions over them that
    optimal.solve hands to HiGHS and :meth:`evaluate` computes directly for given decisions."""

    def __init__(self, facts, cost, options=None, offload=True, hints=None, timings=PAIRED_TIMINGS):
        """``timings``: the offload Evicts a gap may take (those that fit it; an early one where the
        touch that opens it only reads the tensor); ``hints``: {(tensor, gap): Evict}, one offered
        beside them for that gap (a heuristic plan's own, so that the model's decisions include
        that plan). ``facts``: the schedule's facts.Facts."""
        schedule = facts.schedule
        self.schedule, self.cost, self.facts, self.touch = schedule, cost, facts, facts.touch
        self.options = options if options is not None else algorithm_options(schedule, cost)
        steps, tensors = schedule.steps, schedule.tensors
        self.n = n = len(steps)
        self.size = schedule.tensor_bytes.tolist()
        self.shared = 1.0 - cost.copy_overlap
        # a step's workspace is counted as its algorithm's (or, without a choice, its own) by
        # _algo_terms, for the step and for each rerun of it: not as a touched tensor
        self.skip = {st.ws for st in steps if st.ws is not None}
        self.producer, self.keep = facts.producer, facts.keep
        self.names, self.lo, self.hi, self.integer = [], [], [], []
        self.d, self.o, self.x, self.R, self.z = {}, {}, {}, {}, {}
        self.u, self.w = {}, {}                           # (t, g, hold) -> offload var; (t, g, lead) -> prefetch var
        self.holds, self.leads, self.pairs = {}, {}, {}   # (t, g) -> the holds (delay, early), leads, Evicts offered
        hints = hints or {}
        for s, opts in self.options.items():
            for k in range(len(opts)):
                self.x[s, k] = self.variable(f"x[{s},{k}]", integer=True)
        self.gaps = []                                    # (t, g, a, b) with b - a >= 2
        for t, ts in self.touch.ordered():
            if t in self.skip:
                continue
            src = self.producer.get(t)
            for g in range(len(ts) - 1):
                a, b = ts[g], ts[g + 1]
                if b - a < 2:
                    continue
                self.gaps.append((t, g, a, b))
                if t not in self.keep and src is not None and src.node.op.recomputable:
                    self.d[t, g] = self.variable(f"d[{t},{g}]", integer=True)
                writes = not facts.only_reads(t, a)       # (a gradient accumulated there is written too)
                pairs = {ev for ev in tuple(timings) + ((hints[t, g],) if (t, g) in hints else ())
                         if ev.delay + ev.lead < b - a - 1 and not (ev.early and writes)}
                if offload and t not in self.keep and pairs:
                    self.o[t, g] = self.variable(f"o[{t},{g}]")
                    self.pairs[t, g] = pairs
                    self.holds[t, g] = holds = sorted({(ev.delay, ev.early) for ev in pairs})
                    self.leads[t, g] = leads = sorted({ev.lead for ev in pairs})
                    for hold in holds:
                        self.u[t, g, hold] = self.variable(f"u[{t},{g},{hold}]", integer=True)
                    for ld in leads:
                        self.w[t, g, ld] = self.variable(f"w[{t},{g},{ld}]", integer=True)
        self._host_copies()
        self.secs = [cost.step_seconds(schedule, s) for s in steps]
        self.crossing = [[] for _ in range(n)]           # stage -> gaps strictly across it
        for gap in self.gaps:
            for s in range(gap[2] + 1, gap[3]):
                self.crossing[s].append(gap)
        self.to_end = [[] for _ in range(n)]             # stage -> kept-to-end tensors past their last touch
        for t in self.keep:
            if t in self.touch:
                for s in range(self.touch[t][-1] + 1, n):
                    self.to_end[s].append(t)
        self.kappa, self.kappa_runs = {}, {}
        self._chains()
        self._chain_drops()
        self.xfer = {t: cost.transfer_seconds(tensors[t].nbytes)
                     for t in {t for t, _ in self.o} | {u for _, u in self.phi}}
        self.evictions_vars = sorted(list(self.d.values()) + list(self.u.values()) + list(self.w.values()))
        self.timeline = Timeline(self)
        self._stages = None                               # evaluate's expressions, built once

    def variable(self, name, integer=False, hi=1.0) -> int:
        """A new variable (at least 0, at most ``hi``); its index."""
        self.names.append(name)
        self.lo.append(0.0)
        self.hi.append(hi)
        self.integer.append(integer)
        return len(self.names) - 1

    # -- presence -----------------------------------------------------------------
    def _host_copies(self):
        """``c[t,g,k]``: offloading gap g with timing k copies (``v[t,g,k]`` less any earlier offload
        whose host copy is still valid: the lowering then only drops the tensor). ``earlier[t,g]``:
        the offloads of t before gap g whose host copy is valid at its end, from which the lowering
        restores t by a prefetch in the chain instead of recomputing it."""
        self.c, self.earlier = {}, {}
        steps = self.schedule.steps
        for t, ts in self.touch.ordered():
            if t in self.skip:
                continue
            writes = [i for i in ts if t in steps[i].writes or t in steps[i].updates]
            for g in range(len(ts) - 1):
                valid = [g2 for g2 in range(g) if (t, g2) in self.o and not any(ts[g2] < i <= ts[g] for i in writes)]
                self.earlier[t, g] = [self.o[t, g2] for g2 in valid]
                for hold in self.holds.get((t, g), ()) if valid else ():
                    self.c[t, g, hold] = self.variable(f"c[{t},{g},{hold}]")

    def copied(self, t, g, hold) -> int:
        """The variable that says gap g's offload copies t, with ``hold`` (delay, early)."""
        return self.c.get((t, g, hold), self.u[t, g, hold])

    def present(self, gap, s, memory=False) -> Affine:
        """Whether the tensor of ``gap`` is on the device at stage ``s`` strictly inside it (with
        ``memory``, less what a chain may have dropped: :meth:`_chain_drops`)."""
        t, g, a, b = gap
        e = Affine(1.0)
        if memory:
            for v in self._dropped_by(t, g, s):
                e.add(v, -1.0)
        if (t, g) in self.d:
            e.add(self.d[t, g], -1.0)
        if (t, g) in self.o:
            e.add(self.o[t, g], -1.0)
            for lead in self.leads[t, g]:       # prefetched
                if s >= b - lead:
                    e.add(self.w[t, g, lead], 1.0)
            for hold in self.holds[t, g]:       # held while its copy runs (a valid host copy: dropped)
                if s <= a + hold[0]:
                    e.add(self.copied(t, g, hold), 1.0)
        return e

    def before(self, u, s, memory=False) -> Affine:
        """Whether arena tensor ``u`` is on the device when stage ``s`` begins (before its chain);
        ``memory``: as :meth:`present`."""
        ts = self.touch.get(u)
        if ts is None:
            return Affine(0.0)
        if ts[0] <= s <= ts[-1]:
            k = np.searchsorted(ts, s)
            if ts[k] == s:                            # touched at s: absent if written first, or dropped
                if k == 0:
                    return Affine(0.0)
                e = Affine(1.0)
                if (u, k - 1) in self.d:
                    e.add(self.d[u, k - 1], -1.0)
                if memory:
                    for v in self._dropped_by(u, k - 1, s):
                        e.add(v, -1.0)
                return e
            a, b = ts[k - 1], ts[k]
            return self.present((u, k - 1, a, b), s, memory) if b - a >= 2 else Affine(1.0)
        return Affine(1.0 if u in self.keep and s > ts[-1] else 0.0)

    def _host_valid(self, u, s) -> list:
        """The offloads of ``u`` whose host copy is valid in stage ``s`` (see _host_copies), also
        past its last touch: the lowering restores it from there for a later chain."""
        ts = self.touch.get(u)
        if ts is None or u in self.skip or len(ts) < 2 or s <= ts[0]:
            return []
        step = self.schedule.steps[ts[-1]]
        if s > ts[-1] and (u in step.writes or u in step.updates):
            return []
        g = min(int(np.searchsorted(ts, s)), len(ts) - 1) - 1   # the gap that s lies in or closes, or the last
        return self.earlier[u, g] + ([self.o[u, g]] if (u, g) in self.o else [])

    def _arena_ins(self, p):
        tensors = self.schedule.tensors
        return [u for u in dict.fromkeys(self.schedule.steps[p].ins) if u is not None and not tensors[u].persistent]

    # -- restore chains -------------------------------------------------------------
    def _chains(self):
        """The reruns ``R[s,p]`` that some decision can force, and what forces them: ``needs``, one
        (rerun, the rerun of the input's producer or None, input, before-expression, host vars) per
        input of a rerun that may be off the device; ``phi[s,u]``: the chain of stage s prefetches u
        from a valid host copy (the lowering does, rather than recompute it); ``h[i]``: need i's
        input is held while its rerun runs (restored by the chain)."""
        steps = self.schedule.steps
        self.needs = []
        todo = [(b, self.producer[t].index) for (t, g, a, b) in self.gaps if (t, g) in self.d]
        seen = set()
        while todo:
            s, p = todo.pop()
            if (s, p) in seen:
                continue
            seen.add((s, p))
            self.R[s, p] = self.variable(f"R[{s},{p}]")
            for k in range(len(self.options.get(p, ()))):
                self.z[s, p, k] = self.variable(f"z[{s},{p},{k}]")
            for u in self._arena_ins(p):
                pb = self.before(u, s)
                if not pb.terms and pb.const >= 1:
                    continue
                q = self.producer.get(u)
                ok = q is not None and q.node.op.recomputable
                if ok:
                    todo.append((s, q.index))
                self.needs.append(((s, p), (s, q.index) if ok else None, u, pb, self._host_valid(u, s)))
        self.reruns = [[] for _ in range(self.n)]
        for s, p in sorted(self.R):                 # in schedule order
            self.reruns[s].append(p)
        self.phi = {}
        for (s, _), _, u, _, host in self.needs:
            if host and (s, u) not in self.phi:
                self.phi[s, u] = self.variable(f"phi[{s},{u}]", integer=True)
        for (t, g, a, b) in self.gaps:
            if (t, g) in self.d and self.earlier[t, g] and (b, t) not in self.phi:
                self.phi[b, t] = self.variable(f"phi[{b},{t}]", integer=True)
        self.h = [self.variable(f"h[{s},{p},{u}]") for (s, p), _, u, _, _ in self.needs]
        self.fresh = []                             # (var, R var, before): var >= R - before
        self.needs_of = {}                          # rerun -> the indices of its needs
        for i, (rerun, *_) in enumerate(self.needs):
            self.needs_of.setdefault(rerun, []).append(i)
        self.fusions = []         # (F var, seconds saved, [vars it is at most], [1 - vars], stage, reader, fused)
        for s, cands in enumerate(self.reruns):
            for a in cands:
                self._fusions(s, a, steps[a].node.op, [self.R[s, a]], self.secs[a])
        self.fusions_by_stage = [[] for _ in range(self.n)]
        for f in self.fusions:
            self.fusions_by_stage[f[4]].append(f)
        self.written = {}             # (s, p) -> [(output, its var)]: what rerun p writes (not on the device before)
        for (s, p), r in sorted(self.R.items()):
            self.written[s, p] = []
            for u in dict.fromkeys(steps[p].outs):
                if u is None or self.schedule.tensors[u].persistent:
                    continue
                pb = self.before(u, s)
                if pb.terms:
                    w = self.variable(f"w[{s},{p},{u}]")
                    self.fresh.append((w, r, pb))
                    self.written[s, p].append((u, w))
                elif pb.const < 1:
                    self.written[s, p].append((u, r))

    def _chain_drops(self):
        """``kappa[t,g][s]``: the chain of stage ``s`` inside gap g reran t's producer, which writes
        other outputs too, and dropped t after it (the lowering drops what a chain wrote and the
        stage does not need, also a value that was on the device before where it was not computed
        there: a prefetched value, or one a chain restored before), so t is off the device from
        ``s`` to the touch that closes the gap. The model does not follow what that costs later;
        for the memory rows only, t may count as off from ``s`` on where such a rerun runs there
        (at most its R; at most once a gap): fewer bytes than the lowering holds, as a lower bound
        may. Those reruns are whole (integer): the memory rows would rather run a part of one."""
        tensors = self.schedule.tensors
        for (t, g, a, b) in self.gaps:
            src = self.producer.get(t)
            outs = [u for u in dict.fromkeys(src.outs) if u is not None and not tensors[u].persistent] if src else []
            if len(outs) < 2:
                continue
            runs = {s: self.R[s, src.index] for s in range(a + 1, b) if (s, src.index) in self.R}
            if runs:
                self.kappa[t, g] = {s: self.variable(f"kappa[{t},{g},{s}]") for s in runs}
                self.kappa_runs[t, g] = runs
                for r in runs.values():
                    self.integer[r] = True

    def _dropped_by(self, t, g, s) -> list:
        """The kappa variables of gap g of t at stages up to ``s``: t is off the device if one is set."""
        return [v for s2, v in self.kappa.get((t, g), {}).items() if s2 <= s]

    def _fusions(self, s, a, op, within, first=True):
        """The lowering runs rerun ``a`` (``op``: with what is merged into it) and the one rerun of its
        stage that reads its first output as one pass, where ``op.fused`` offers it and the stage's
        step does not read that output: ``F`` (at most each of ``within``, the reader's ``R`` and one
        less each other reader's) saves what a pass costs (the first merge runs for what its reader
        costs, saving ``a``'s seconds; merged steps merge on, each saving the reader's) and never
        writes that output. The lowering fuses less where other conditions fail: the model then
        counts less time and memory than it runs, as a lower bound may."""
        steps = self.schedule.steps
        y = steps[a].outs[0] if steps[a].outs else None
        if y is None or y in self.touch.by_step[s]:
            return
        rs = [r for r in self.reruns[s] if y in steps[r].ins]
        for b in rs:
            merged = op.fused(steps[b].node.op) if steps[b].ins.count(y) == 1 else None
            if merged is None:
                continue
            v = self.variable(f"F[{s},{a},{b}]")
            self.fusions.append((v, self.secs[a] if first else self.secs[b], within + [self.R[s, b]],
                                 [self.R[s, r] for r in rs if r != b], s, b, (a, y)))
            self._fusions(s, b, merged, [v], first=False)

    # -- the stage's terms ----------------------------------------------------------
    def _algo_terms(self, s, e, what, var=None):
        """Add step ``s``'s ``what`` ("seconds" or "workspace") to ``e``: by its algorithm's one-hot
        (``var``: the rerun's z variables instead), or its fixed value scaled by ``var``."""
        opts = self.options.get(s)
        steps = self.schedule.steps
        if opts:
            for k, (sec, algo) in enumerate(opts):
                coef = sec if what == "seconds" else aligned(algo.workspace)
                e.add(self.x[s, k] if var is None else self.z[var[0], s, k], coef)
            return
        c = self.secs[s] if what == "seconds" else (self.size[steps[s].ws] if steps[s].ws is not None else 0)
        if var is None:
            e.const += c
        else:
            e.add(self.R[var], c)

    def chain_seconds(self, s) -> Affine:
        """The compute seconds of stage ``s``'s restore chain: its reruns, less what fused passes save."""
        e = Affine()
        for p in self.reruns[s]:
            self._algo_terms(p, e, "seconds", var=(s, p))
        for v, saved, *_ in self.fusions_by_stage[s]:
            e.add(v, -saved)
        return e

    def step_seconds(self, s) -> Affine:
        e = Affine()
        self._algo_terms(s, e, "seconds")
        return e

    def step_memory(self, s) -> Affine:
        """Bytes on the device at stage ``s``'s own step."""
        e = Affine(float(sum(self.size[t] for t in self.touch.by_step[s] if t not in self.skip)
                         + sum(self.size[t] for t in self.to_end[s])))
        for gap in self.crossing[s]:
            e.extend(self.present(gap, s, memory=True), self.size[gap[0]])
        self._algo_terms(s, e, "workspace")
        return e

    def before_chain(self, s) -> Affine:
        """Bytes on the device when stage ``s``'s restore chain begins."""
        step = self.schedule.steps[s]
        e = Affine(float(sum(self.size[t] for t in self.to_end[s])))
        for u in self.touch.by_step[s]:
            if u not in self.skip and u != step.ws:
                e.extend(self.before(u, s, memory=True), self.size[u])
        for gap in self.crossing[s]:
            e.extend(self.present(gap, s, memory=True), self.size[gap[0]])
        return e

    def rerun_memory(self, s, p, base) -> Affine:
        """The least bytes on the device while rerun ``p`` of stage ``s`` runs: ``base``
        (:meth:`before_chain`), the inputs the chain restored for it, its outputs and its workspace,
        less the outputs a fused pass would not write. (What the chain holds for its later reruns
        depends on the order the lowering walks a branching chain in: not counted.)"""
        e = Affine(base.const, base.terms)
        for i in self.needs_of.get((s, p), ()):
            e.add(self.h[i], self.size[self.needs[i][2]])
        for u, w in self.written[s, p]:
            e.add(w, self.size[u])
        self._algo_terms(p, e, "workspace", var=(s, p))
        for v, _, _, _, st, b, (a, y) in self.fusions_by_stage[s]:
            if a == p:                          # p's first output is not written
                e.add(v, -self.size[y])
            if b == p and any(self.needs[i][2] == y for i in self.needs_of.get((s, p), ())):
                e.add(v, -self.size[y])         # nor held as p's input
        return e

    def points(self, s) -> list:
        """The memory expressions of stage ``s``: its step, and each rerun of its chain."""
        base = self.before_chain(s) if self.reruns[s] else None
        return [self.step_memory(s)] + [self.rerun_memory(s, p, base) for p in self.reruns[s]]

    # -- the MILP -------------------------------------------------------------------
    def rows(self, limit):
        """The constraints as (expression, lower, upper, unit) over the variables; unit: "bytes",
        "seconds" or "logic" (0/1 coefficients), for scaling."""
        out = []
        for s, opts in self.options.items():
            out.append((Affine(0.0, {self.x[s, k]: 1.0 for k in range(len(opts))}), 1.0, 1.0, "logic"))
        for key, v in self.d.items():
            if key in self.o:
                out.append((Affine(0.0, {v: 1.0, self.o[key]: 1.0}), -math.inf, 1.0, "logic"))
        for (t, g), v in self.o.items():        # one hold and one lead where offloaded: a pair offered
            out.append((Affine(0.0, {v: 1.0, **{self.u[t, g, h]: -1.0 for h in self.holds[t, g]}}), 0.0, 0.0,
                        "logic"))
            out.append((Affine(0.0, {v: 1.0, **{self.w[t, g, ld]: -1.0 for ld in self.leads[t, g]}}), 0.0, 0.0,
                        "logic"))
            for h in self.holds[t, g]:
                for ld in self.leads[t, g]:
                    if offload_evict(h, ld) not in self.pairs[t, g]:
                        out.append((Affine(0.0, {self.u[t, g, h]: 1.0, self.w[t, g, ld]: 1.0}), -math.inf, 1.0,
                                    "logic"))
        for (t, g, h), v in self.c.items():
            out.append((Affine(0.0, {v: 1.0, self.u[t, g, h]: -1.0, **{u: 1.0 for u in self.earlier[t, g]}}), 0.0,
                        math.inf, "logic"))
        for (t, g, a, b) in self.gaps:              # a dropped gap is restored: by its producer, or from the host
            if (t, g) in self.d:
                e = Affine(0.0, {self.R[b, self.producer[t].index]: 1.0, self.d[t, g]: -1.0})
                if (b, t) in self.phi:
                    e.add(self.phi[b, t], 1.0)
                out.append((e, 0.0, math.inf, "logic"))
        for (s, u), v in self.phi.items():         # a prefetch needs a valid host copy
            host = self._host_valid(u, s)
            out.append((Affine(0.0, {v: 1.0, **{w: -1.0 for w in host}}), -math.inf, 0.0, "logic"))
        for i, (rerun, restorer, u, pb, host) in enumerate(self.needs):   # an input not on the device
            e = Affine(pb.const, pb.terms).add(self.R[rerun], -1.0)
            if restorer is not None:
                e.add(self.R[restorer], 1.0)
            if (rerun[0], u) in self.phi:
                e.add(self.phi[rerun[0], u], 1.0)
            out.append((e, 0.0, math.inf, "logic"))
            out.append((Affine(pb.const, pb.terms).add(self.h[i], 1.0).add(self.R[rerun], -1.0), 0.0, math.inf,
                        "logic"))
        for key, by in self.kappa.items():           # at most its rerun, at most once a gap
            for s, v in by.items():
                out.append((Affine(0.0, {v: 1.0, self.kappa_runs[key][s]: -1.0}), -math.inf, 0.0, "logic"))
            out.append((Affine(0.0, {v: 1.0 for v in by.values()}), -math.inf, 1.0, "logic"))
        for w, r, pb in self.fresh:
            out.append((Affine(pb.const, pb.terms).add(w, 1.0).add(r, -1.0), 0.0, math.inf, "logic"))
        for (s, p, k), v in self.z.items():
            out.append((Affine(0.0, {v: 1.0, self.R[s, p]: -1.0, self.x[p, k]: -1.0}), -1.0, math.inf, "logic"))
        into = {}                                   # (stage, reader) -> the fusions into it: one at most
        for v, _, within, without, s, b, _ in self.fusions:   # upper bounds only: fusing is never penalized
            into.setdefault((s, b), []).append(v)
            for u in within:
                out.append((Affine(0.0, {v: 1.0, u: -1.0}), -math.inf, 0.0, "logic"))
            for u in without:
                out.append((Affine(0.0, {v: 1.0, u: 1.0}), -math.inf, 1.0, "logic"))
        for vs in into.values():
            if len(vs) > 1:
                out.append((Affine(0.0, {v: 1.0 for v in vs}), -math.inf, 1.0, "logic"))
        for s in range(self.n):
            for e in self.points(s):
                out.append((e, -math.inf, limit, "bytes"))
        return out + self.timeline.rows()

    def decisions(self, x) -> tuple:
        """(evictions, algorithms) of the variable values ``x``."""
        ev = {key: RECOMPUTE for key, v in self.d.items() if x[v] > 0.5}
        for (t, g), v in self.o.items():
            if x[v] > 0.5:
                ev[t, g] = offload_evict(max(self.holds[t, g], key=lambda h: x[self.u[t, g, h]]),
                                         max(self.leads[t, g], key=lambda ld: x[self.w[t, g, ld]]))
        algos = {s: opts[max(range(len(opts)), key=lambda k: x[self.x[s, k]])][1]
                 for s, opts in self.options.items()}
        return ev, algos

    # -- direct evaluation ------------------------------------------------------------------
    def encode(self, evictions, algos):
        """The decision variables' values for (evictions, algorithms), or None where the model
        cannot express them (a gap it does not offer, an offload timing it does not list)."""
        x = np.zeros(len(self.names))
        for (t, g), ev in evictions.items():
            if ev.kind == "recompute":
                if (t, g) not in self.d:
                    return None
                x[self.d[t, g]] = 1.0
                continue
            if ev not in self.pairs.get((t, g), ()):
                return None
            x[self.o[t, g]] = x[self.u[t, g, (ev.delay, ev.early)]] = x[self.w[t, g, ev.lead]] = 1.0
        for s, opts in self.options.items():
            names = [a.name for _, a in opts]
            x[self.x[s, names.index(algos[s].name) if s in algos else 0]] = 1.0
        return x

    def evaluate(self, evictions, algos):
        """The :class:`Evaluation` of the decisions, computed directly (the reruns and the prefetches
        of chains by a fixed point over what each restores, as the lowering walks them); None where
        the model cannot express them, or a rerun needs an input nothing restores."""
        x = self.encode(evictions, algos)
        if x is None:
            return None
        if self._stages is None:                 # the expressions do not depend on x: built once
            self._compile()
        for (t, g, h), v in self.c.items():
            x[v] = max(0.0, x[self.u[t, g, h]] - sum(x[u] for u in self.earlier[t, g]))
        host = lambda s, u: any(x[w] > 0.5 for w in self._host_valid(u, s))   # noqa: E731
        for (t, g, a, b) in self.gaps:
            if (t, g) in self.d and x[self.d[t, g]]:
                if (b, t) in self.phi and host(b, t):
                    x[self.phi[b, t]] = 1.0
                else:
                    x[self.R[b, self.producer[t].index]] = 1.0
        there = self._before.values(x) >= 0.5    # each need's input on the device before its chain
        changed = True
        while changed:
            changed = False
            for i, (rerun, restorer, u, _, _) in enumerate(self.needs):
                if not x[self.R[rerun]] or there[i]:
                    continue
                if (rerun[0], u) in self.phi and host(rerun[0], u):
                    changed |= not x[self.phi[rerun[0], u]]
                    x[self.phi[rerun[0], u]] = 1.0
                elif restorer is None:
                    return None
                elif not x[self.R[restorer]]:
                    x[self.R[restorer]], changed = 1.0, True
        for (s, p, k), v in self.z.items():
            x[v] = x[self.R[s, p]] * x[self.x[p, k]]
        for i, (rerun, *_) in enumerate(self.needs):
            x[self.h[i]] = 0.0 if there[i] else x[self.R[rerun]]
        fresh = self._fresh.values(x)
        for (w, r, _), b in zip(self.fresh, fresh):
            x[w] = max(0.0, x[r] - b)
        for key, by in self.kappa.items():         # the least memory the rows allow: from the first rerun on
            first = min((s for s, r in self.kappa_runs[key].items() if x[r] > 0.5), default=None)
            for s, v in by.items():
                x[v] = 1.0 if s == first else 0.0
        into = set()
        for v, _, within, without, s, b, _ in self.fusions:   # parents first; the first into a reader wins
            x[v] = 0.0 if (s, b) in into else min([x[u] for u in within] + [1.0 - x[u] for u in without])
            if x[v]:
                into.add((s, b))
        peak = float(self._stages.values(x).max(initial=0.0))
        seconds = self.timeline.evaluate(x)
        return Evaluation(seconds, int(round(peak)), x)

    def _compile(self):
        self._stages = Compiled([e for s in range(self.n) for e in self.points(s)], len(self.names))
        self._before = Compiled([pb for _, _, _, pb, _ in self.needs], len(self.names))
        self._fresh = Compiled([pb for _, _, pb in self.fresh], len(self.names))
