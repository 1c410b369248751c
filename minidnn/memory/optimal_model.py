"""The stage model of the exact reference (optimal.py): its variables, and the expressions over
them that the MILP constrains and :meth:`Model.evaluate` computes directly for given decisions.
optimal.py's docstring describes the model."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..schedule import aligned
from .planner import algorithm_options
from .program import Evict, touches

# The timings an offload may take, as Evict(delay, lead): its copy runs over the ``delay`` stages after
# the touch that opens its gap (the value held there), its prefetch over the ``lead`` stages before
# the touch that closes it; 0 is a copy that compute waits for (the value held by neither). A copy on
# a GPU profile takes several of a small network's layers (a ResNet-20 activation at batch 4 on
# v100-16gb: 30 us of copy, 5-20 us a layer), so one stage each way cannot hide it; the longer
# timings can, and hold the value longer.
OFFLOAD_TIMINGS = ((0, 0), (1, 1), (2, 2), (4, 4), (8, 8))
RECOMPUTE = Evict("recompute")



class Evaluation(NamedTuple):
    """The model's view of given decisions: modelled ``seconds``, ``peak`` arena bytes, the
    placement's two regions' bytes (``regions``) and the variable values ``x``."""

    seconds: float
    peak: int
    regions: int
    x: np.ndarray


class _Affine:
    """const + sum coef * var: a model expression."""

    __slots__ = ("const", "terms")

    def __init__(self, const=0.0, terms=None):
        self.const, self.terms = const, dict(terms or {})

    def add(self, var, coef):
        self.terms[var] = self.terms.get(var, 0.0) + coef

    def value(self, x) -> float:
        return self.const + sum(c * x[v] for v, c in self.terms.items())


class Model:
    """The stage model of one schedule and cost model: variables, and expressions over them that
    :meth:`solve` hands to HiGHS and :meth:`evaluate` computes directly for given decisions."""

    def __init__(self, schedule, cost, touch=None, options=None, offload=True, hints=None):
        """``hints``: {(tensor, gap): (delay, lead)}, offload timings offered beside OFFLOAD_TIMINGS
        (a heuristic plan's own, so that the model expresses that plan as it runs)."""
        self.schedule, self.cost = schedule, cost
        self.touch = touch if touch is not None else touches(schedule)
        self.options = options if options is not None else algorithm_options(schedule, cost)
        steps, tensors = schedule.steps, schedule.tensors
        self.n = n = len(steps)
        self.size = schedule.tensor_bytes.tolist()
        self.shared = 1.0 - cost.copy_overlap
        # a step's workspace is counted as its algorithm's (or, without a choice, its own) by
        # _algo_terms, for the step and for each rerun of it: not as a touched tensor
        self.skip = {st.ws for st in steps if st.ws is not None}
        self.producer = {t: s for s in steps if s.kind == "forward" for t in s.outs}
        keep = set(schedule.outputs) | ({schedule.loss} if schedule.loss is not None else set())
        self.keep = keep
        self.names, self.lo, self.hi, self.integer = [], [], [], []
        self.d, self.o, self.v, self.x, self.R, self.z, self.A = {}, {}, {}, {}, {}, {}, {}
        self.ks, self.timing = {}, {}                     # (t, g) -> offload timings k; (t, g, k) -> timing
        hints = hints or {}
        for s, opts in self.options.items():
            for k in range(len(opts)):
                self.x[s, k] = self._var(f"x[{s},{k}]", integer=True)
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
                if t not in keep and src is not None and src.node.op.recomputable:
                    self.d[t, g] = self._var(f"d[{t},{g}]", integer=True)
                timings = list(OFFLOAD_TIMINGS)
                if (t, g) in hints and hints[t, g] not in timings:
                    timings.append(hints[t, g])
                timings = [(dl, ld) for dl, ld in timings if dl + ld < b - a - 1]
                if offload and t not in keep and timings:
                    self.o[t, g] = self._var(f"o[{t},{g}]")
                    self.ks[t, g] = list(range(len(timings)))
                    for k, timing in enumerate(timings):
                        self.v[t, g, k] = self._var(f"v[{t},{g},{k}]", integer=True)
                        self.timing[t, g, k] = timing
        self.T = [self._var(f"T[{s}]", hi=math.inf) for s in range(n)]
        self._host_copies()
        self._left_out = self._stages = None             # evaluate's rows and expressions, built once
        self.xfer = {t: cost.transfer_seconds(tensors[t].nbytes) for t, _ in self.o}
        self.secs = [cost.step_seconds(schedule, s) for s in steps]
        self.crossing = [[] for _ in range(n)]           # stage -> gaps strictly across it
        for gap in self.gaps:
            for s in range(gap[2] + 1, gap[3]):
                self.crossing[s].append(gap)
        self.to_end = [[] for _ in range(n)]             # stage -> kept-to-end tensors past their last touch
        for t in keep:
            if t in self.touch:
                for s in range(self.touch[t][-1] + 1, n):
                    self.to_end[s].append(t)
        self._chains()
        self._regions()

    def _var(self, name, integer=False, hi=1.0) -> int:
        self.names.append(name)
        self.lo.append(0.0)
        self.hi.append(hi)
        self.integer.append(integer)
        return len(self.names) - 1

    # -- presence -----------------------------------------------------------------
    def _host_copies(self):
        """``c[t,g,k]``: offloading gap g with timing k copies (``v[t,g,k]`` less any earlier offload
        whose host copy is still valid: the lowering then only drops the tensor). ``earlier[t,g]``:
        the offloads of t before gap g whose host copy is valid at its end, for which the lowering
        restores t by a prefetch; the model does not let t be dropped or recomputed in a chain then."""
        self.c, self.earlier = {}, {}
        steps = self.schedule.steps
        for t, ts in self.touch.ordered():
            if t in self.skip:
                continue
            writes = [i for i in ts if t in steps[i].writes or t in steps[i].updates]
            for g in range(len(ts) - 1):
                valid = [g2 for g2 in range(g) if (t, g2) in self.o and not any(ts[g2] < i <= ts[g] for i in writes)]
                self.earlier[t, g] = [self.o[t, g2] for g2 in valid]
                for k in self.ks.get((t, g), ()) if valid else ():
                    self.c[t, g, k] = self._var(f"c[{t},{g},{k}]")

    def copied(self, t, g, k) -> int:
        """The variable that says gap g's offload copies t, with timing k."""
        return self.c.get((t, g, k), self.v[t, g, k])

    def present(self, gap, s) -> _Affine:
        """Whether the tensor of ``gap`` is on the device at stage ``s`` strictly inside it."""
        t, g, a, b = gap
        e = _Affine(1.0)
        if (t, g) in self.d:
            e.add(self.d[t, g], -1.0)
        if (t, g) in self.o:
            e.add(self.o[t, g], -1.0)
            for k in self.ks[t, g]:
                delay, lead = self.timing[t, g, k]
                if s >= b - lead:                # prefetched
                    e.add(self.v[t, g, k], 1.0)
                elif s <= a + delay:             # held while its copy runs (a valid host copy: dropped)
                    e.add(self.copied(t, g, k), 1.0)
        return e

    def before(self, u, s) -> _Affine:
        """Whether arena tensor ``u`` is on the device when stage ``s`` begins (before its chain)."""
        ts = self.touch.get(u)
        if ts is None:
            return _Affine(0.0)
        if ts[0] <= s <= ts[-1]:
            k = np.searchsorted(ts, s)
            if ts[k] == s:                            # touched at s: absent if written first, or dropped
                if k == 0:
                    return _Affine(0.0)
                e = _Affine(1.0)
                if (u, k - 1) in self.d:
                    e.add(self.d[u, k - 1], -1.0)
                return e
            a, b = ts[k - 1], ts[k]
            return self.present((u, k - 1, a, b), s) if b - a >= 2 else _Affine(1.0)
        return _Affine(1.0 if u in self.keep and s > ts[-1] else 0.0)

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

    def _chains(self):
        """The reruns ``R[s,p]`` that some decision can force, and what forces them."""
        steps = self.schedule.steps
        self.needs = []              # (R var, [(R var of the input's producer or None, before-expression)])
        todo = [(b, self.producer[t].index) for (t, g, a, b) in self.gaps if (t, g) in self.d]
        seen = set()
        while todo:
            s, p = todo.pop()
            if (s, p) in seen:
                continue
            seen.add((s, p))
            self.R[s, p] = self._var(f"R[{s},{p}]")
            for k in range(len(self.options.get(p, ()))):
                self.z[s, p, k] = self._var(f"z[{s},{p},{k}]")
            for u in self._arena_ins(p):
                pb = self.before(u, s)
                if not pb.terms and pb.const >= 1:
                    continue
                q = self.producer.get(u)
                ok = q is not None and q.node.op.recomputable
                if ok:
                    todo.append((s, q.index))
                self.needs.append(((s, p), (s, q.index) if ok else None, pb, self._host_valid(u, s)))
        self.reruns = [[] for _ in range(self.n)]
        for s, p in sorted(self.R):                 # in schedule order: an order the chain can run in
            self.reruns[s].append(p)
        readers = {}                                # (s, q) -> the reruns of stage s reading q's values
        for (s, p), restorer, *_ in self.needs:
            if restorer is not None:
                readers.setdefault(restorer, set()).add(p)
        self.held = {}                              # A var -> the reruns whose pairs force it
        for s, cands in enumerate(self.reruns):
            for p in cands:
                for q in cands:
                    if q >= p:
                        break
                    by = {r for r in readers.get((s, q), ()) if r >= p}
                    kept = any(u in self.touch.by_step[s] for u in steps[q].outs)
                    if by or kept:
                        self.A[s, q, p] = v = self._var(f"A[{s},{q},{p}]")
                        self.held[v] = (s, q, None if kept else sorted(by))
        self.fusions = []                           # (F var, seconds saved, [vars it is at most], [1 - vars])
        for s, cands in enumerate(self.reruns):
            for a in cands:
                self._fusions(s, a, steps[a].node.op, [self.R[s, a]], self.secs[a])
        self.fusions_by_stage = [[] for _ in range(self.n)]
        for f in self.fusions:
            self.fusions_by_stage[f[4]].append(f)
        self.out_bytes = {p: sum(self.size[u] for u in dict.fromkeys(steps[p].outs)
                                 if u is not None and not self.schedule.tensors[u].persistent)
                          for p in {p for _, p in self.R}}

    def _fusions(self, s, a, op, within, first=True):
        """The lowering runs rerun ``a`` (``op``: with what is merged into it) and the one rerun of its
        stage that reads its first output as one pass, where ``op.fused`` offers it and the stage's
        step does not read that output: ``F`` (at most each of ``within``, the reader's ``R`` and one
        less each other reader's) saves what a pass costs: the first merge runs for what its reader
        costs, saving ``a``'s seconds; merged steps merge on, each saving the reader's."""
        steps = self.schedule.steps
        y = steps[a].outs[0] if steps[a].outs else None
        if y is None or y in self.touch.by_step[s]:
            return
        rs = [r for r in self.reruns[s] if y in steps[r].ins]
        for b in rs:
            merged = op.fused(steps[b].node.op) if steps[b].ins.count(y) == 1 else None
            if merged is None:
                continue
            v = self._var(f"F[{s},{a},{b}]")
            self.fusions.append((v, self.secs[a] if first else self.secs[b], within + [self.R[s, b]],
                                 [self.R[s, r] for r in rs if r != b], s, b))
            self._fusions(s, b, merged, [v], first=False)

    # -- the stage's terms ----------------------------------------------------------
    def _algo_terms(self, s, e, what, var=None):
        """Add step ``s``'s ``what`` ("seconds" or "workspace") to ``e``: by its algorithm's one-hot
        (``var``: the rerun's z variables instead), or its fixed value scaled by ``var``."""
        opts = self.options.get(s)
        steps, tensors = self.schedule.steps, self.schedule.tensors
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

    def _regions(self):
        """The placement's two regions (placement.place_program): a tensor with a residency other
        than its computed one (offloaded, prefetched, recomputed) is *mobile* (``m[t]``, at least
        and at most its causes: a drop or offload of one of its gaps, or ``y[s,q,u]``, a rerun ``q``
        restoring it where it was not on the device); the others are resident. The regions' arena
        is the resident bytes' peak ``M_res`` plus the mobile bytes' ``M_mob``."""
        causes = {}
        for (t, g), v in list(self.d.items()) + list(self.o.items()):
            causes.setdefault(t, []).append(v)
        self.y = {}
        for s, q in self.R:
            for u in dict.fromkeys(self.schedule.steps[q].outs):
                if u is None or self.schedule.tensors[u].persistent:
                    continue
                b = self.before(u, s)
                if b.terms or b.const < 1:
                    self.y[s, q, u] = (self._var(f"y[{s},{q},{u}]"), b)
                    causes.setdefault(u, []).append(self.y[s, q, u][0])
        self.causes = causes
        self.m = {t: self._var(f"m[{t}]") for t in causes}
        self.M = (self._var("M_res", hi=math.inf), self._var("M_mob", hi=math.inf))
        self.alive = [[] for _ in range(self.n)]          # stage -> tensors alive at its step
        for t, ts in self.touch.ordered():
            if t not in self.skip:
                for s in range(ts[0], self.n if t in self.keep else ts[-1] + 1):
                    self.alive[s].append(t)

    def resident(self, s, rerun=None) -> _Affine:
        """Resident-region bytes at stage ``s``'s step, or (``rerun``) at that rerun of its chain."""
        e = _Affine()
        for t in self.alive[s]:
            if rerun is not None and self.touch[t][0] == s:
                continue                                  # written by the step, after the chain
            e.const += self.size[t]
            if t in self.m:
                e.add(self.m[t], -self.size[t])
        if rerun is None:
            self._algo_terms(s, e, "workspace")
        else:
            self._algo_terms(rerun, e, "workspace", var=(s, rerun))
        return e

    def step_memory(self, s) -> _Affine:
        """Bytes on the device at stage ``s``'s own step."""
        e = _Affine(float(sum(self.size[t] for t in self.touch.by_step[s] if t not in self.skip)
                          + sum(self.size[t] for t in self.to_end[s])))
        for gap in self.crossing[s]:
            p = self.present(gap, s)
            e.const += self.size[gap[0]] * p.const
            for v, c in p.terms.items():
                e.add(v, self.size[gap[0]] * c)
        self._algo_terms(s, e, "workspace")
        return e

    def before_chain(self, s) -> _Affine:
        """Bytes on the device when stage ``s``'s restore chain begins."""
        step = self.schedule.steps[s]
        e = _Affine(float(sum(self.size[t] for t in self.to_end[s])))
        for u in self.touch.by_step[s]:
            if u not in self.skip and u != step.ws:
                b = self.before(u, s)
                e.const += self.size[u] * b.const
                for v, c in b.terms.items():
                    e.add(v, self.size[u] * c)
        for gap in self.crossing[s]:
            p = self.present(gap, s)
            e.const += self.size[gap[0]] * p.const
            for v, c in p.terms.items():
                e.add(v, self.size[gap[0]] * c)
        return e

    def rerun_memory(self, s, p, base) -> _Affine:
        """Bytes on the device while rerun ``p`` of stage ``s`` runs: ``base`` (:meth:`before_chain`),
        the values of earlier reruns still held, its own outputs and its workspace."""
        e = _Affine(base.const, base.terms)
        for q in self.reruns[s]:
            if q >= p:
                break
            if (s, q, p) in self.A:
                e.add(self.A[s, q, p], self.out_bytes[q])
        e.add(self.R[s, p], self.out_bytes[p])
        self._algo_terms(p, e, "workspace", var=(s, p))
        return e

    def compute(self, s) -> _Affine:
        e = _Affine()
        self._algo_terms(s, e, "seconds")
        for p in self.reruns[s]:
            self._algo_terms(p, e, "seconds", var=(s, p))
        for v, saved, *_ in self.fusions_by_stage[s]:
            e.add(v, -saved)
        for (t, g, k), v in self.v.items():         # copies that compute waits for
            delay, lead = self.timing[t, g, k]
            if not delay and s == self.touch[t][g]:
                e.add(self.copied(t, g, k), self.xfer[t])
            if not lead and s == self.touch[t][g + 1]:
                e.add(v, self.xfer[t])
        return e

    def copies(self, s) -> _Affine:
        e = _Affine()
        for (t, g, k), v in self.v.items():         # each copy spread evenly over its stages
            a, b = self.touch[t][g], self.touch[t][g + 1]
            delay, lead = self.timing[t, g, k]
            if a < s <= a + delay:
                e.add(self.copied(t, g, k), self.xfer[t] / delay)
            elif b - lead <= s < b:
                e.add(v, self.xfer[t] / lead)
        return e

    # -- the MILP -------------------------------------------------------------------
    def rows(self, limit, regions=False):
        """The constraints as (expression, lower, upper, unit) over the variables; unit: "bytes",
        "seconds" or "logic" (0/1 coefficients), for scaling. With ``regions``, the placement's
        two regions must fit ``limit`` too."""
        out = self._region_rows(limit) if regions else []
        for s, opts in self.options.items():
            out.append((_Affine(0.0, {self.x[s, k]: 1.0 for k in range(len(opts))}), 1.0, 1.0, "logic"))
        for key, v in self.d.items():
            if key in self.o:
                out.append((_Affine(0.0, {v: 1.0, self.o[key]: 1.0}), -math.inf, 1.0, "logic"))
        for (t, g), v in self.o.items():
            out.append((_Affine(0.0, {v: 1.0, **{self.v[t, g, k]: -1.0 for k in self.ks[t, g]}}), 0.0, 0.0, "logic"))
        for (t, g, k), v in self.c.items():
            out.append((_Affine(0.0, {v: 1.0, self.v[t, g, k]: -1.0, **{u: 1.0 for u in self.earlier[t, g]}}), 0.0,
                        math.inf, "logic"))
        for (t, g, a, b) in self.gaps:
            if (t, g) in self.d:
                out.append((_Affine(0.0, {self.R[b, self.producer[t].index]: 1.0, self.d[t, g]: -1.0}), 0.0, math.inf,
                            "logic"))
        for rerun, restorer, pb, host in self.needs:   # an input not on the device is restored by a rerun
            e = _Affine(pb.const, pb.terms)
            e.add(self.R[rerun], -1.0)
            if restorer is not None:
                e.add(self.R[restorer], 1.0)
            out.append((e, 0.0, math.inf, "logic"))
        out += self.left_out()
        for (s, p, k), v in self.z.items():
            out.append((_Affine(0.0, {v: 1.0, self.R[s, p]: -1.0, self.x[p, k]: -1.0}), -1.0, math.inf, "logic"))
        for v, (s, q, by) in self.held.items():     # held if read later (or by the step itself)
            for r in by or [None]:
                e = _Affine(0.0, {v: 1.0, self.R[s, q]: -1.0})
                if r is not None:
                    e.add(self.R[s, r], -1.0)
                out.append((e, 0.0 if r is None else -1.0, math.inf, "logic"))
        into = {}                                   # (stage, reader) -> the fusions into it: one at most
        for v, _, within, without, s, b in self.fusions:   # upper bounds only: fusing is never penalized
            into.setdefault((s, b), []).append(v)
            for u in within:
                out.append((_Affine(0.0, {v: 1.0, u: -1.0}), -math.inf, 0.0, "logic"))
            for u in without:
                out.append((_Affine(0.0, {v: 1.0, u: 1.0}), -math.inf, 1.0, "logic"))
        for vs in into.values():
            if len(vs) > 1:
                out.append((_Affine(0.0, {v: 1.0 for v in vs}), -math.inf, 1.0, "logic"))
        for s in range(self.n):
            out.append((self.step_memory(s), -math.inf, limit, "bytes"))
            base = self.before_chain(s) if self.reruns[s] else None
            for p in self.reruns[s]:
                out.append((self.rerun_memory(s, p, base), -math.inf, limit, "bytes"))
            c, x = self.compute(s), self.copies(s)
            e = _Affine(-c.const, {v: -k for v, k in c.terms.items()})
            for v, k in x.terms.items():
                e.add(v, -self.shared * k)
            e.add(self.T[s], 1.0)
            out.append((e, 0.0, math.inf, "seconds"))
            if x.terms:
                e = _Affine(0.0, {v: -k for v, k in x.terms.items()})
                e.add(self.T[s], 1.0)
                out.append((e, 0.0, math.inf, "seconds"))
        return out

    def left_out(self):
        """The rows that leave out what the lowering restores from a valid host copy instead (a
        prefetch, not modelled): a drop, or a rerun's input not on the device, after an offload."""
        out = []
        for (t, g), v in self.d.items():
            for u in self.earlier[t, g]:
                out.append((_Affine(0.0, {v: 1.0, u: 1.0}), -math.inf, 1.0, "logic"))
        for rerun, _, pb, host in self.needs:
            for u in host:
                e = _Affine(-pb.const, {v: -c for v, c in pb.terms.items()})
                e.add(self.R[rerun], 1.0)
                e.add(u, 1.0)
                out.append((e, -math.inf, 1.0, "logic"))
        return out

    def _points(self, s):
        """(resident bytes, all bytes) at stage ``s``'s step and at each rerun of its chain."""
        base = self.before_chain(s) if self.reruns[s] else None
        return [(self.resident(s), self.step_memory(s))] + [
            (self.resident(s, p), self.rerun_memory(s, p, base)) for p in self.reruns[s]]

    def _region_rows(self, limit):
        out = []
        for (s, q, _), (v, b) in self.y.items():   # y = R and not before
            r = self.R[s, q]
            out.append((_Affine(0.0, {v: 1.0, r: -1.0}), -math.inf, 0.0, "logic"))
            out.append((_Affine(b.const, {v: 1.0, **b.terms}), -math.inf, 1.0, "logic"))
            e = _Affine(b.const, b.terms)
            e.add(v, 1.0)
            e.add(r, -1.0)
            out.append((e, 0.0, math.inf, "logic"))
        for t, m in self.m.items():                # m = or(causes)
            for u in self.causes[t]:
                out.append((_Affine(0.0, {m: 1.0, u: -1.0}), 0.0, math.inf, "logic"))
            out.append((_Affine(0.0, {m: 1.0, **{u: -1.0 for u in self.causes[t]}}), -math.inf, 0.0, "logic"))
        res, mob = self.M
        for s in range(self.n):
            for r, total in self._points(s):
                e = _Affine(r.const, r.terms)
                e.add(res, -1.0)
                out.append((e, -math.inf, 0.0, "bytes"))
                e = _Affine(total.const - r.const, total.terms)
                for v, c in r.terms.items():
                    e.add(v, -c)
                e.add(mob, -1.0)
                out.append((e, -math.inf, 0.0, "bytes"))
        out.append((_Affine(0.0, {res: 1.0, mob: 1.0}), -math.inf, limit, "bytes"))
        return out

    def decisions(self, x) -> tuple:
        """(evictions, algorithms) of the variable values ``x``."""
        ev = {key: RECOMPUTE for key, v in self.d.items() if x[v] > 0.5}
        ev.update({(t, g): Evict("offload", *self.timing[t, g, k]) for (t, g, k), v in self.v.items() if x[v] > 0.5})
        algos = {s: opts[max(range(len(opts)), key=lambda k: x[self.x[s, k]])][1]
                 for s, opts in self.options.items()}
        return ev, algos

    # -- direct evaluation ------------------------------------------------------------------
    def evaluate(self, evictions, algos):
        """The :class:`Evaluation` of the decisions, computed
        directly (the reruns by a fixed point over what each restores); None where the model cannot
        express them, leaves them out, or a rerun needs an input nothing restores."""
        x = np.zeros(len(self.names))
        for (t, g), ev in evictions.items():
            if ev.kind == "recompute":
                if (t, g) not in self.d:
                    return None
                x[self.d[t, g]] = 1.0
                continue
            ks = self.ks.get((t, g))
            if not ks:
                return None
            # its own timing, else the longest that holds the value no longer each way
            k = max((k for k in ks if self.timing[t, g, k][0] <= ev.delay and self.timing[t, g, k][1] <= ev.lead),
                    key=lambda k: (self.timing[t, g, k] == (ev.delay, ev.lead), self.timing[t, g, k]),
                    default=ks[0])
            x[self.o[t, g]] = x[self.v[t, g, k]] = 1.0
        for s, opts in self.options.items():
            names = [a.name for _, a in opts]
            x[self.x[s, names.index(algos[s].name) if s in algos else 0]] = 1.0
        for (t, g, a, b) in self.gaps:
            if (t, g) in self.d and x[self.d[t, g]]:
                x[self.R[b, self.producer[t].index]] = 1.0
        changed = True
        while changed:
            changed = False
            for rerun, restorer, pb, _ in self.needs:
                if x[self.R[rerun]] and pb.value(x) < 0.5:
                    if restorer is None:
                        return None
                    if not x[self.R[restorer]]:
                        x[self.R[restorer]], changed = 1.0, True
        for (t, g, k), v in self.c.items():
            x[v] = max(0.0, x[self.v[t, g, k]] - sum(x[u] for u in self.earlier[t, g]))
        for (s, p, k), v in self.z.items():
            x[v] = x[self.R[s, p]] * x[self.x[p, k]]
        for v, (s, q, by) in self.held.items():
            x[v] = x[self.R[s, q]] * (1.0 if by is None else max(x[self.R[s, r]] for r in by))
        into = set()
        for v, _, within, without, s, b in self.fusions:      # parents first; the first into a reader wins
            x[v] = 0.0 if (s, b) in into else min([x[u] for u in within] + [1.0 - x[u] for u in without])
            if x[v]:
                into.add((s, b))
        for (s, q, _), (v, b) in self.y.items():
            x[v] = x[self.R[s, q]] * (b.value(x) < 0.5)
        for t, m in self.m.items():
            x[m] = max(x[u] for u in self.causes[t])
        if self._left_out is None:
            self._left_out = self.left_out()
        if any(not lo - 1e-9 <= e.value(x) <= hi + 1e-9 for e, lo, hi, _ in self._left_out):
            return None                          # a combination the model leaves out
        if self._stages is None:                 # the expressions do not depend on x: built once
            self._stages = [(self.compute(s), self.copies(s), self._points(s)) for s in range(self.n)]
        peak = 0.0
        res, mob = self.M
        for s, (compute, copies, points) in enumerate(self._stages):
            c, cp = compute.value(x), copies.value(x)
            x[self.T[s]] = max(c + self.shared * cp, cp)
            for r, total in points:
                r, total = r.value(x), total.value(x)
                peak = max(peak, total)
                x[res], x[mob] = max(x[res], r), max(x[mob], total - r)
        return Evaluation(float(x[self.T].sum()), int(round(peak)), int(round(x[res] + x[mob])), x)
