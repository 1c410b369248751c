"""The timeline of the exact reference's model (optimal_model.py): the simulator's two streams,
as linear rows over event times.

The compute stream passes, in each stage ``s``, the points ``P[s]`` (the stage begins), ``B[s]``
(its step begins: its prefetches issued, its restore chain run) and ``Q[s]`` (its step done, and
the waits for the offloads it frees). The copy stream is one queue in the order the program
issues its copies (simulator.py): the prefetches issued before a stage, then the ones its chain
issues, then the offloads after its step, each group by tensor; a copy starts once it is issued
and the queue is free (``Y[j]``: the queue's clock once copy j is done, or would be), and takes
from the compute beside it the share ``1 - copy_overlap`` of its time. A prefetch is waited for
before the step that reads it, an offload where its buffer is freed: at once (no hold), or after
the step that ends its hold.

Every row is one of the simulator's max-plus relations, so for given decisions the least event
times meeting them are the simulator's, except where the model cannot tell when a chain's rerun
reads a copy still on its way (it is waited for before the stage's step instead, a lower bound).
The relations that hold only where a copy runs are written with the copy's variable and a
constant ``M`` (an upper bound on every event time); the same relation between the copy's
release and its deadline without ``M`` (implied, so still exact) tightens the relaxation.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy import sparse

class Affine:
    """const + sum coef * var: a model expression."""

    __slots__ = ("const", "terms")

    def __init__(self, const=0.0, terms=None):
        self.const, self.terms = const, dict(terms or {})

    def add(self, var, coef):
        self.terms[var] = self.terms.get(var, 0.0) + coef
        return self

    def extend(self, other, scale=1.0):
        self.const += scale * other.const
        for v, c in other.terms.items():
            self.add(v, scale * c)
        return self

    def value(self, x) -> float:
        return self.const + sum(c * x[v] for v, c in self.terms.items())


class Compiled:
    """Expressions as one sparse matrix: :meth:`values` evaluates them all at once."""

    def __init__(self, exprs, nvars):
        rows, cols, vals = [], [], []
        for r, e in enumerate(exprs):
            for v, c in e.terms.items():
                rows.append(r)
                cols.append(v)
                vals.append(c)
        self.matrix = sparse.csr_matrix((vals, (rows, cols)), shape=(len(exprs), nvars))
        self.const = np.array([e.const for e in exprs], np.float64)

    def values(self, x) -> np.ndarray:
        return self.matrix @ x + self.const


# phases of a stage: the prefetches issued before it, those its restore chain issues, the offloads
# issued as its step starts (early), the offloads after its step
BEFORE, CHAIN, STEP, AFTER = 0, 1, 2, 3


class Copy(NamedTuple):
    """A copy that a decision may issue: its variable (1: it runs), ``seconds``, the stage and phase
    it is issued in, its place in that group, and the point that waits for it: ("B", s), ("Q", s)
    or ("P", s) (an offload without a hold: waited for at once, before the next offload issues)."""

    var: int
    tensor: int
    seconds: float
    stage: int
    phase: int
    key: tuple
    due: tuple


def _copies(m) -> list:
    """Every copy of model ``m``'s decisions, in the copy queue's order."""
    out = []
    for (t, g, hold) in m.u:
        a = m.touch[t][g]
        delay, early = hold
        due = ("Q", a + delay) if delay or early else ("P", a + 1)
        out.append(Copy(m.copied(t, g, hold), t, m.xfer[t], a, STEP if early else AFTER, (t, g, hold), due))
    for (t, g, lead), v in m.w.items():
        b = m.touch[t][g + 1]
        out.append(Copy(v, t, m.xfer[t], b - lead, BEFORE, (t, g, lead), ("B", b)))
    for (s, u), v in m.phi.items():
        out.append(Copy(v, u, m.xfer[u], s, CHAIN, (u,), ("B", s)))
    return sorted(out, key=lambda c: (c.stage, c.phase, c.key))


class Timeline:
    """The event-time variables of model ``m`` and their rows; :meth:`evaluate` the least event
    times for given variable values, by the same relations."""

    def __init__(self, m):
        self.m = m
        n = m.n
        self.P = [m.variable(f"P[{s}]", hi=math.inf) for s in range(n + 1)]
        self.B = [m.variable(f"B[{s}]", hi=math.inf) for s in range(n)]
        self.Q = [m.variable(f"Q[{s}]", hi=math.inf) for s in range(n)]
        self.copies = _copies(m)
        self.Y = [m.variable(f"Y[{j}]", hi=math.inf) for j in range(len(self.copies))]
        self.T = m.variable("T", hi=math.inf)
        self.groups, self.waiting = {}, {}     # (stage, phase) -> copy indices, in queue order; due -> those
        for j, c in enumerate(self.copies):
            self.groups.setdefault((c.stage, c.phase), []).append(j)
            self.waiting.setdefault(c.due, []).append(j)
        self.S = {key: m.variable(f"S[{key[0]},{key[1]}]", hi=math.inf) for key in sorted(m.R)}
        self._chain_order()
        self.chain = [m.chain_seconds(s) for s in range(n)]
        self.step = [m.step_seconds(s) for s in range(n)]
        slowest = sum(max((sec for sec, _ in m.options[s]), default=0.0) if s in m.options else m.secs[s]
                      for s in range(n))
        reruns = sum(max((sec for sec, _ in m.options[p]), default=0.0) if p in m.options else m.secs[p]
                     for _, p in m.R)
        self._exprs = None                     # evaluate's arrays, built once
        self.M = slowest + reruns + (1.0 + m.shared) * sum(c.seconds for c in self.copies)

    def _chain_order(self):
        """What orders the reruns of a chain: ``after[s,p]``: the reruns (s, q) that restore an input
        of rerun p (with the expression that says the input was on the device before the chain,
        where p need not wait for q); ``reads[s,p]``: the copies it may wait for (a prefetch on its
        way in stage s, or the chain's own prefetch of its input); ``pass_seconds[s,p]``: its
        seconds, or nothing where a fused pass may take it in (the model does not tell which)."""
        m = self.m
        steps = m.schedule.steps
        self.after = {key: [] for key in self.S}
        for rerun, restorer, u, pb, _ in m.needs:
            if restorer is not None:
                self.after[rerun].append((restorer, pb))
        fused = {(f[4], p) for f in m.fusions for p in (f[5], f[6][0])}
        self.pass_seconds = {}
        for s, p in self.S:
            e = Affine()
            if (s, p) not in fused:
                m._algo_terms(p, e, "seconds", var=(s, p))
            self.pass_seconds[s, p] = e
        readers = {}                               # (stage, tensor) -> the reruns there that read it
        for s, p in self.S:
            for u in dict.fromkeys(steps[p].ins):
                readers.setdefault((s, u), []).append(p)
        self.reads = {key: [] for key in self.S}
        for j, c in enumerate(self.copies):
            stages = [c.stage] if c.phase == CHAIN else range(c.stage, c.due[1] + 1) if c.phase == BEFORE else ()
            for s in stages:
                for p in readers.get((s, c.tensor), ()):
                    self.reads[s, p].append(j)

    # -- expressions ----------------------------------------------------------------
    def _lost(self, stage, phase, e, scale=1.0, upto=None, after=None):
        """Add to ``e`` the compute time the copies of (stage, phase) take (``upto``: those before
        copy ``upto`` only; ``after``: those after copy ``after`` only)."""
        js = self.groups.get((stage, phase), ())
        if upto is not None:
            js = js[:js.index(upto)]
        if after is not None:
            js = js[js.index(after) + 1:]
        for j in js:
            c = self.copies[j]
            e.add(c.var, scale * self.m.shared * c.seconds)
        return e

    def release(self, j):
        """The compute stream's clock when copy ``j`` is issued."""
        c = self.copies[j]
        if c.phase == AFTER:
            return self._lost(c.stage, AFTER, Affine(0.0, {self.Q[c.stage]: 1.0}), upto=j)
        if c.phase == STEP:
            return self._lost(c.stage, STEP, Affine(0.0, {self.B[c.stage]: 1.0}), upto=j)
        e = Affine(0.0, {self.P[c.stage]: 1.0})
        if c.phase == CHAIN:
            self._lost(c.stage, BEFORE, e)
        return self._lost(c.stage, c.phase, e, upto=j)

    def due(self, j):
        """The compute stream's clock at the point that waits for copy ``j``."""
        c = self.copies[j]
        kind, s = c.due
        if kind == "B":
            return Affine(0.0, {self.B[s]: 1.0})
        if kind == "Q":
            return Affine(0.0, {self.Q[s]: 1.0})
        return self._lost(s - 1, AFTER, Affine(0.0, {self.P[s]: 1.0}), scale=-1.0, after=j)

    def rows(self):
        """(expression, lower, upper, "seconds") rows: every relation is expression >= 0."""
        m, out = self.m, []
        for s in range(m.n):
            e = Affine(0.0, {self.B[s]: 1.0, self.P[s]: -1.0}).extend(self.chain[s], -1.0)
            self._lost(s, BEFORE, e, -1.0)
            self._lost(s, CHAIN, e, -1.0)
            out.append(e)
            out.append(self._lost(s, STEP, Affine(0.0, {self.Q[s]: 1.0, self.B[s]: -1.0}), -1.0)
                       .extend(self.step[s], -1.0))
            out.append(self._lost(s, AFTER, Affine(0.0, {self.P[s + 1]: 1.0, self.Q[s]: -1.0}), -1.0))
        for (s, p), v in self.S.items():           # a rerun starts after the stage's prefetches issue
            out.append(self._lost(s, BEFORE, Affine(0.0, {v: 1.0, self.P[s]: -1.0}), -1.0))
            out.append(Affine(0.0, {self.B[s]: 1.0, v: -1.0}).extend(self.pass_seconds[s, p], -1.0))
            for q, pb in self.after[s, p]:          # after what restores its input, unless that was there
                out.append(Affine(0.0, {v: 1.0, self.S[q]: -1.0}).extend(self.pass_seconds[q], -1.0)
                           .extend(pb, self.M))
            for j in self.reads[s, p]:              # after the copy it reads, where both run
                c = self.copies[j]
                out.append(Affine(2 * self.M, {v: 1.0, self.Y[j]: -1.0}).add(c.var, -self.M)
                           .add(self.m.R[s, p], -self.M))
        for j, c in enumerate(self.copies):
            if j:
                out.append(Affine(0.0, {self.Y[j]: 1.0, self.Y[j - 1]: -1.0, c.var: -c.seconds}))
            out.append(Affine(0.0, {self.Y[j]: 1.0, c.var: -c.seconds}).extend(self.release(j), -1.0))
            # waited for where it runs: due >= Y[j] - M (1 - var)
            out.append(self.due(j).add(self.Y[j], -1.0).add(c.var, -self.M).extend(Affine(self.M)))
            # implied by the rows above where it runs, and always true where it does not
            out.append(self.due(j).extend(self.release(j), -1.0).add(c.var, -c.seconds))
        out.append(Affine(0.0, {self.T: 1.0, self.P[m.n]: -1.0}))
        if self.copies:
            out.append(Affine(0.0, {self.T: 1.0, self.Y[-1]: -1.0}))
        return [(e, 0.0, math.inf, "seconds") for e in out]

    # -- direct evaluation ------------------------------------------------------------------
    def _compile(self):
        """The parts of the rows that do not depend on event times, as arrays (built once)."""
        m = self.m
        n = m.n
        keys = sorted(self.S)
        exprs = self.chain + self.step + [self.pass_seconds[k] for k in keys]
        edges = [(k, q, pb) for k in keys for q, pb in self.after[k]]
        exprs += [pb for _, _, pb in edges]
        self._exprs = Compiled(exprs, len(m.names))
        self._keys, self._edges = keys, [(k, q) for k, q, _ in edges]
        self._vars = np.array([c.var for c in self.copies], np.int64)
        self._secs = np.array([c.seconds for c in self.copies])
        self._group_of = np.zeros(len(self.copies), np.int64)
        self._groups = sorted(self.groups)
        for g, key in enumerate(self._groups):
            self._group_of[self.groups[key]] = g
        self._n = n

    def evaluate(self, x) -> float:
        """The least event times meeting the rows for the variable values ``x`` (0 or 1 for every
        copy), written into ``x``; the step's seconds (``T``)."""
        if self._exprs is None:
            self._compile()
        m, n = self.m, self._n
        vals = self._exprs.values(x)
        chain, step = vals[:n], vals[n:2 * n]
        nk = len(self._keys)
        pass_s = dict(zip(self._keys, vals[2 * n:2 * n + nk]))
        absent = {}                              # (rerun, restorer) -> its input was not on the device
        for (k, q), pb in zip(self._edges, vals[2 * n + nk:]):
            if pb < 0.5:
                absent.setdefault(k, []).append(q)
        on = (x[self._vars] > 0.5).tolist()
        dur = (self._secs * on).tolist()
        within = {}                              # copy -> (lost before it in its group, lost after it)
        total = {}
        for key, js in self.groups.items():
            acc = 0.0
            for j in js:
                within[j] = acc
                acc += m.shared * dur[j]
            total[key] = acc
            for j in js:
                within[j] = (within[j], acc - within[j] - m.shared * dur[j])
        Y = [0.0] * len(self.copies)
        S = {}
        queue, P = 0.0, 0.0

        def run(j, release):
            nonlocal queue
            queue = Y[j] = max(queue, release + within[j][0]) + dur[j]

        waits = lambda point: [Y[j] for j in self.waiting.get(point, ()) if on[j]]   # noqa: E731
        for s in range(n):
            x[self.P[s]] = P
            lost_before = total.get((s, BEFORE), 0.0)
            for j in self.groups.get((s, BEFORE), ()):
                run(j, P)
            for j in self.groups.get((s, CHAIN), ()):
                run(j, P + lost_before)
            start = P + lost_before
            ends = [start + chain[s] + total.get((s, CHAIN), 0.0)]
            for p in m.reruns[s]:
                k = (s, p)
                t = max([start] + [S[q] + pass_s[q] for q in absent.get(k, ())]
                        + ([Y[j] for j in self.reads[k] if on[j]] if x[m.R[k]] > 0.5 else []))
                S[k] = x[self.S[k]] = t
                ends.append(t + pass_s[k])
            b = x[self.B[s]] = max(ends + waits(("B", s)))
            for j in self.groups.get((s, STEP), ()):
                run(j, b)
            q = x[self.Q[s]] = max([b + total.get((s, STEP), 0.0) + step[s]] + waits(("Q", s)))
            for j in self.groups.get((s, AFTER), ()):
                run(j, q)
            P = max([q + total.get((s, AFTER), 0.0)] + [Y[j] + within[j][1] for j in self.waiting.get(("P", s + 1), ())
                                                          if on[j]])
        x[self.P[n]] = P
        x[self.Y] = Y
        x[self.T] = max(P, queue)
        return float(x[self.T])
