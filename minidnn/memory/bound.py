"""A lower bound on the step time of every plan within a budget, from the steps where memory peaks.

At a schedule step ``s`` the unlimited program holds ``curve[s]`` arena bytes. Within an arena
limit, ``s`` may run a slower algorithm with a smaller workspace (for the difference in seconds),
and the gaps that span ``s`` (program.py's words: a tensor between two touches) must give up the
rest of ``curve[s] - limit``, each either

- *dropped*, and restored by its chain after ``s``, before the touch that closes the gap: at least
  the seconds of the chain the lowering runs for it alone (``program.recompute_seconds``; one run
  of a producer may restore all its outputs, so a producer is charged once, at the least of its
  outputs' chains), or
- *offloaded*: its copy out done before ``s`` starts, and its prefetch, issued once ``s`` is over,
  done before the touch that closes the gap. A copy out starts after the touch that opens the gap,
  or beside it where that touch only reads the tensor (an early offload, as vDNN's); the host keeps
  a copy until the tensor is written again, so a gap whose tensor an earlier touch left unchanged
  may have been copied out as early as that touch's gap allows (the lowering copies it once).

The time a plan adds to the unlimited step is counted where it is added: ``added[k]``, what it has
added by the time schedule step ``k`` starts (its stalls and recomputations; non-decreasing in
``k``), and the slower algorithms of the peak steps. The copy stream is one queue: the copies out that may start
from a step on take at most the unlimited time from there to ``s`` plus what the plan adds in
between, and the prefetches due by step ``e`` at most the time from ``s`` to ``e`` plus what it adds
there; what ``s`` drops is recomputed in what the plan adds after ``s``. Time added before one
peak step and after another is the same time only where the windows overlap, so stalls that several
peak steps need at different places add up.

A gap that is off the device at one step it spans may be back at another (a prefetch issued early,
a chain that restores it sooner), so each step frees its own share; a gap dropped at any step is
recomputed once at least. The least such time over the ``peaks`` highest steps of the curve is a
floor under the predicted step time of every plan, whatever it evicts and however it times its
copies: HiGHS's linear relaxation of these choices (scipy's ``linprog``), and where they are few
(WHOLE_CHOICES), the bound HiGHS proves with each choice whole (scipy's ``milp``). It leaves
out placement, the copies' holds and leads, the order of the copy queue and the other steps, so
the best plan may be slower than the floor; a plan at the floor is optimal.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

from ..errors import ConfigError
from ..schedule import aligned
from .planner import algorithm_options, fastest
from .facts import Facts
from .program import lower, recompute_seconds
from .transfers import step_curve


# The floor's choices are taken whole (0 or 1: a mixed-integer program) where the program has at most
# this many of them, and HiGHS stops after this many nodes (the bound it has proven there; nodes, not
# seconds, so that the floor is the same on every machine). Random DAG 16 (seed 0) on v100-16gb (104
# choices, 0.05 s): @ 60% 277.2 -> 290.2 us, the optimum; @ 40% 285.2 -> 292.7 us (the optimum over
# every timing 293.3); random DAG 24 (seed 1) @ 40% (244) 514.6 -> 524.3 us in 0.03 s. DenseNet-small
# b4 @ 40% (1328) gains 0.15% for 2.3 s, ResNet-50 b256 @ 15% on a100-40gb (4727) nothing in 13 s, a
# floor `minidnn plan` prints beside every budgeted plan (python scripts/bench_optimal.py).
WHOLE_CHOICES = 1000
FLOOR_NODES = 1


@dataclass(frozen=True)
class Floor:
    """``seconds``: the least predicted step time of any plan within the budget (inf: none fits);
    ``baseline``: the unlimited step's; ``step``: the highest step of the unlimited curve (None
    where no step is over the limit)."""

    seconds: float
    baseline: float
    step: int = None

    @property
    def overhead(self) -> float:
        """The floor over the unlimited step, minus one."""
        return self.seconds / self.baseline - 1


def step_time_floor(schedule, budget, cost, peaks=8, whole=None) -> Floor:
    """The :class:`Floor` of ``schedule`` within ``budget`` bytes on ``cost``: the least time a plan
    adds that frees the ``peaks`` highest steps of the unlimited curve (module docstring), its
    choices taken whole where there are at most ``whole`` of them (None: WHOLE_CHOICES). ``budget``:
    bytes, as ``MemoryConfig(budget=...).resolve(liveness peak)`` gives them."""
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget <= 0:
        raise ConfigError(f"step_time_floor takes a budget in bytes (an int above 0), not {budget!r}: "
                          f"MemoryConfig(budget=...).resolve(liveness_peak_bytes) gives one")
    facts = Facts(schedule)
    touch, producer = facts.touch, facts.producer
    options = algorithm_options(schedule, cost)
    quick = fastest(options)
    secs = np.array([cost.step_seconds(schedule, s, quick.get(s.index)) for s in schedule.steps])
    baseline = float(secs.sum())
    curve = step_curve(lower(schedule, {}, facts, quick), len(schedule.steps))
    limit = budget - schedule.persistent_bytes
    n = len(schedule.steps)
    # times in the program are in units of the unlimited step, and each step's bytes in units of what
    # it holds over the limit (HiGHS's tolerances are absolute: seconds of 1e-5 beside bytes of 1e9
    # made ResNet-302's program take 25 s to solve)
    start = np.concatenate([[0.0], np.cumsum(secs)]) / baseline   # start[i]: when step i starts, unlimited
    gaps = [(t, ts[g], ts[g + 1]) for t, ts in touch.ordered() for g in range(len(ts) - 1)]
    opens = np.array([a for _, a, _ in gaps])
    closes = np.array([b for _, _, b in gaps])
    nbytes = np.array([int(schedule.tensor_bytes[t]) for t, _, _ in gaps], np.float64)
    copy = np.array([cost.transfer_seconds(schedule.tensors[t].nbytes) for t, _, _ in gaps]) / baseline
    # when a gap's copy out may start (the step ``issue`` starts, unlimited): after the touch that
    # opens it, or beside it where that touch only reads the tensor (program.Evict.early); and where
    # the tensor is not written between an earlier touch and this gap, as early as that touch's
    # (the host keeps a copy until the tensor is written again: the lowering copies it out once)
    issue, anchor = np.empty(len(gaps), int), np.empty(len(gaps), int)   # anchor: that touch
    first = {}                               # tensor -> (issue, anchor) of its copy since it was last written
    for i, (t, a, _) in enumerate(gaps):
        written = not facts.only_reads(t, a)
        if written or t not in first:
            first[t] = (a + 1 if written else a, a)
        issue[i], anchor[i] = first[t]
    tops = [int(s) for s in np.argsort(-curve, kind="stable")[:peaks] if curve[s] > limit]
    if not tops:
        return Floor(baseline, baseline)
    spans = {s: np.flatnonzero((opens < s) & (s < closes)) for s in tops}
    union = sorted(set().union(*map(set, spans.values())))
    # the chains of the gaps that span a peak step only (a deep network has 10^4 gaps, each a walk)
    redo = np.full(len(gaps), math.inf)
    for i in union:
        t, _, b = gaps[i]
        redo[i] = recompute_seconds(t, b, touch, producer, secs, schedule.tensors) / baseline
    rows = _Rows()
    # added[k]: the time the plan has added to the unlimited step by the time step k starts (stalls
    # and recomputations; k = n: by its end), slower algorithms aside: non-decreasing in k
    points = sorted({0, n} | set(tops) | {s + 1 for s in tops} | set(issue[union]) | set(anchor[union])
                    | set(closes[union]))
    added = {k: rows.variable() for k in points}
    for k, k2 in zip(points, points[1:]):
        rows.add({added[k]: 1.0, added[k2]: -1.0}, 0.0)
    slowed = {}                              # top step -> [(variable, bytes its algorithm frees, seconds lost)]
    for s in tops:
        opts = options.get(s, [])
        slowed[s] = [(rows.variable(upper=1.0), aligned(opts[0][1].workspace) - aligned(algo.workspace),
                      (t - opts[0][0]) / baseline) for t, algo in opts[1:] if aligned(algo.workspace) < aligned(opts[0][1].workspace)]
        if slowed[s]:
            rows.add({y: 1.0 for y, _, _ in slowed[s]}, 1.0)   # s runs one algorithm

    def slower(lo, hi) -> dict:
        """The seconds slower algorithms add to the top steps in [lo, hi), as coefficients."""
        return {y: lost for s in tops if lo <= s < hi for y, _, lost in slowed[s]}

    # a gap dropped at any step is restored once at least; one run of a producer restores all its
    # outputs, so its chain is charged once, at the least of its outputs' chains
    dropped, runs, charged = {}, {}, {}
    for i in union:
        if math.isfinite(redo[i]):
            src = producer[gaps[i][0]]
            if src.index not in runs:
                runs[src.index] = rows.variable(upper=1.0)
            dropped[i] = ran = runs[src.index]
            charged[ran] = min(charged.get(ran, math.inf), redo[i])
    rows.add({**charged, added[n]: -1.0}, 0.0)          # every recomputation runs in the added time
    for s in tops:
        span = spans[s]
        # a gap may be off the device at some of the steps it spans and not at others (a prefetch
        # issued early, a chain that restores it sooner): what it frees at s is s's own choice
        drop = {i: rows.variable(upper=1.0) for i in span if i in dropped}
        off = {i: rows.variable(upper=1.0) for i in span}
        for i in span:
            rows.add({off[i]: 1.0, **({drop[i]: 1.0} if i in drop else {})}, 1.0)
        # the bytes freed at s cover what it holds over the limit
        over = int(curve[s]) - limit
        rows.add({**{drop[i]: -nbytes[i] / over for i in drop}, **{off[i]: -nbytes[i] / over for i in span},
                  **{y: -freed / over for y, freed, _ in slowed[s]}}, -1.0)
        # the copies out issued from a step on are done before s starts, in the unlimited time
        # between plus what the plan adds there; the prefetches due by step e, issued once s is
        # over, arrive before e starts, likewise (the copy stream is one queue)
        # (each sum of copy seconds is a variable: the last sum plus the copies of one more step, so
        # that a row stays short where thousands of gaps span s)
        a = n                                # the earliest touch the copies out from r on follow
        for r, level, group in _levels(span, issue, copy, off, rows, True, lambda r: start[s] - start[r]):
            a = min(a, int(anchor[group].min()))
            if level is not None:
                rows.add({level: 1.0, added[s]: -1.0, added[a]: 1.0,
                          **{y: -c for y, c in slower(r, s).items()}}, start[s] - start[r])
        for e, level, _ in _levels(span, closes, copy, off, rows, False, lambda e: start[e] - start[s + 1]):
            if level is not None:
                rows.add({level: 1.0, added[e]: -1.0, added[s]: 1.0,
                          **{y: -c for y, c in slower(s + 1, e).items()}}, start[e] - start[s + 1])
        # what s drops is recomputed after it
        redone = {}                          # a run of each producer that restores what s drops
        for i in drop:
            ran = dropped[i]
            if ran not in redone:
                redone[ran] = rows.variable(upper=1.0)
            rows.add({drop[i]: 1.0, redone[ran]: -1.0}, 0.0)
            rows.add({redone[ran]: 1.0, ran: -1.0}, 0.0)
        rows.add({**{v: charged[ran] for ran, v in redone.items()}, added[n]: -1.0, added[s]: 1.0}, 0.0)
    total = rows.variable()                  # the time the plan adds to the unlimited step
    rows.add({added[n]: 1.0, **slower(0, n), total: -1.0}, 0.0)
    return Floor(baseline * (1 + rows.minimize(total, WHOLE_CHOICES if whole is None else whole)), baseline, tops[0])


def _levels(span, at, copy, off, rows, descending, room):
    """[(value, variable, gaps)] for each distinct ``at[i]`` of the gaps ``span``, in order (highest
    first where ``descending``): ``gaps``, those of that value; the variable is at least the copy
    seconds of the gaps freed by ``off`` whose value is this one or comes before it, by one row each.
    The variable is None where even every one of those copies takes no longer than ``room(value)``
    (the unlimited time of its window: the row it would bound holds of every plan), and the chain of
    rows ends at the last value that needs one."""
    order = sorted(span, key=lambda i: (-at[i], i) if descending else (at[i], i))
    groups = [(value, list(group)) for value, group in itertools.groupby(order, key=lambda i: int(at[i]))]
    full = np.cumsum([sum(copy[i] for i in group) for _, group in groups])
    needed = [total > room(value) for (value, _), total in zip(groups, full)]
    last = max((k for k, need in enumerate(needed) if need), default=-1)
    out, level = [], None
    for k, (value, group) in enumerate(groups):
        if k <= last:
            new = rows.variable()
            rows.add({**{off[i]: copy[i] for i in group}, **({level: 1.0} if level is not None else {}), new: -1.0},
                     0.0)
            level = new
        out.append((value, level if needed[k] else None, group))
    return out


class _Rows:
    """A linear program built row by row: variables (non-negative, with optional upper bounds) and
    rows ``sum(coefficient * variable) <= bound``, solved by HiGHS."""

    def __init__(self):
        self.upper, self.bounds = [], []
        self.rows, self.cols, self.coefs = [], [], []        # arrays of entries
        self.binary = 0                                      # variables bounded by 1

    def variable(self, upper=None) -> int:
        self.upper.append(upper)
        self.binary += upper == 1.0
        return len(self.upper) - 1

    def add(self, coefficients: dict, bound: float):
        self.add_many(np.zeros((1, 0), bool), np.zeros(0, int), np.zeros(0), coefficients, [bound])

    def add_many(self, mask, variables, coefficients, common: dict, bounds):
        """A row per row of ``mask``: ``coefficients[j] * variables[j]`` where ``mask[r, j]``, plus
        ``common`` (variable -> coefficient) in every row, at most ``bounds[r]``."""
        first = len(self.bounds)
        r, j = np.nonzero(mask)
        extra = np.array(list(common), int)
        n = len(mask)
        self.rows += [first + r, first + np.repeat(np.arange(n), len(extra))]
        self.cols += [variables[j], np.tile(extra, n)]
        self.coefs += [coefficients[j], np.tile(np.array(list(common.values()), np.float64), n)]
        self.bounds += list(bounds)

    def minimize(self, v, integral=0) -> float:
        """The least value of variable ``v``; inf where no point meets every row. Where the program
        has at most ``integral`` variables bounded by 1, with those taking 0 or 1 (a mixed-integer
        program, solved to FLOOR_NODES nodes: the proven bound, at least the linear one)."""
        a = sparse.csr_matrix((np.concatenate(self.coefs), (np.concatenate(self.rows), np.concatenate(self.cols))),
                              shape=(len(self.bounds), len(self.upper)))
        objective = np.zeros(len(self.upper))
        objective[v] = 1.0
        res = linprog(objective, A_ub=a, b_ub=np.array(self.bounds), bounds=[(0, u) for u in self.upper],
                      method="highs")
        if res.status == 2:
            return math.inf
        if res.status != 0:
            raise RuntimeError(f"the floor's linear program did not solve: {res.message}")
        if not 0 < self.binary <= integral:
            return float(res.fun)
        # the variables with an upper bound of 1 are choices every plan makes whole (a gap is on the
        # device at a step or it is not, a producer reruns or it does not, a step runs one algorithm):
        # with them integral the program's least value is a floor still, and a higher one; HiGHS's
        # bound after its first node (presolve, cuts) is proven whatever it stops at
        whole = np.array([u == 1.0 for u in self.upper], int)
        mip = milp(objective, constraints=LinearConstraint(a, -np.inf, np.array(self.bounds)),
                   bounds=Bounds(0, [np.inf if u is None else u for u in self.upper]), integrality=whole,
                   options={"node_limit": FLOOR_NODES})
        if mip.status == 2:
            return math.inf
        bound = getattr(mip, "mip_dual_bound", None)
        return max(float(res.fun), float(bound)) if bound is not None and np.isfinite(bound) else float(res.fun)
