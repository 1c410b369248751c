"""The exact reference: a MILP over the planner's own decisions, solved by HiGHS.

The model has one stage per schedule step and decides, for every gap between
two touches of an arena tensor (program.py's words), whether the tensor is
kept, dropped and recomputed before the touch that closes the gap, or
offloaded and prefetched; and for every step with several algorithms which
one it runs (a one-hot, its workspace in that stage's memory). Its variables:

- ``d[t,g]`` drop, ``v[t,g,k]`` offload with timing ``k`` (binary; ``o[t,g]``
  their sum): the gap's decision;
- ``R[s,p]``: schedule step ``p`` (a forward) runs again in stage ``s``, as
  the lowering's restore chain does: for a dropped gap that closes at ``s``,
  and for each input of a rerun step that is not on the device then
  (Checkmate's frontier-advancing ``R``, ``S`` being the gaps kept);
- ``x[s,a]``: step ``s`` runs algorithm ``a``; ``z[s,p,a]`` linearizes a
  rerun with its step's algorithm (``z >= R + x - 1``);
- ``F[s,a,b]``: reruns ``a`` and ``b`` run as one fused pass (op.fused), which
  costs what ``b`` costs alone;
- ``A[s,q,p]``: the values rerun step ``q`` restored in stage ``s`` are still
  held when rerun ``p`` runs (a later rerun reads them, or the stage's step);
- ``T[s]``: the stage's time on two streams, at least its compute (with what
  the copies beside it take from compute) and at least its copies.

Every relation is a lower bound on what a variable costs (a rerun is forced by
what it restores, a held value by a later reader, a stage's time by its
terms), and the objective (the sum of ``T``) and the memory rows only ever
push them down: so ``R``, ``z``, ``A`` and ``T`` are continuous and can take
their exact values at an optimum, without big-M constraints (freeing is never
penalized).

The memory of a stage is what the lowering holds there: at the step, what it
touches, the gaps kept across it and its workspace; at each rerun of its
restore chain (run in schedule order), what was on the device before the
chain, the earlier reruns' values that a later rerun or the step still reads,
its own outputs and its workspace. (The lowering may order a branching chain
otherwise, and fuses some reruns into one pass that writes less: the model is
then an upper bound.) An offloaded value takes one of a few
timings (``OFFLOAD_TIMINGS``): held over the ``delay`` stages after the touch
that opens its gap while its copy runs, and prefetched over the ``lead``
stages before the touch that closes it, each copy's time spread evenly over
its stages; a value whose host copy is still valid is dropped without a copy.

The model (its variables and expressions) is in optimal_model.py; this file
solves it and turns the solution back into evictions and algorithms, lowered,
placed and simulated by :func:`planner.make_plan` like every plan. Where the
placement needs more than the model's curve, the next round models the
placement's two regions instead, and later rounds the curve again with its
limit lowered by what placement added. The solver starts from the heuristic's
plan where the model admits it, and the reference is the faster of the two.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import highspy
import numpy as np
from scipy import sparse

from ..errors import MemoryBudgetError
from .config import MemoryConfig, format_bytes
from .costmodel import CachedCost, ProfileCost
from .optimal_model import Model
from .planner import algorithm_options, fastest, lower_bound, make_plan, plan_memory, smallest
from .program import touches


@dataclass
class Solution:
    """What the solver reports: ``status`` (HiGHS's words, e.g. "Optimal", "Time limit reached"),
    ``objective`` (the incumbent's modelled seconds, None without one), ``bound`` (the proven lower
    bound on them), ``gap`` (relative MIP gap), ``seconds`` (solve time), the incumbent as minidnn
    decisions, whether the heuristic's plan was given as the starting incumbent, and whether the
    placement's two regions were modelled."""

    status: str
    objective: float
    bound: float
    gap: float
    seconds: float
    evictions: dict
    algos: dict
    warm: bool = False
    regions: bool = False


def solve(model, limit, time_limit=30.0, warm=None, regions=False) -> Solution:
    """Minimize ``model``'s step time within ``limit`` arena bytes (with ``regions``, the placement's
    two regions within it too); ``warm``: variable values (:meth:`Model.evaluate`'s) given to HiGHS
    as its first incumbent."""
    unit = sum(model.secs) or 1.0             # seconds and bytes scaled to about one
    rows = model.rows(limit, regions)
    lo, hi, ri, ci, vals = [], [], [], [], []
    scales = {"bytes": 1.0 / max(limit, 1), "seconds": 1.0 / unit, "logic": 1.0}
    for r, (e, a, b, kind) in enumerate(rows):
        scale = scales[kind]
        lo.append((a - e.const) * scale)
        hi.append((b - e.const) * scale)
        for v, c in e.terms.items():
            ri.append(r)
            ci.append(v)
            vals.append(c * scale)
    nv = len(model.names)
    a = sparse.csc_matrix((vals, (ri, ci)), shape=(len(rows), nv))
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = nv, len(rows)
    cost = np.zeros(nv)
    cost[model.T] = 1.0 / unit
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost, np.array(model.lo), np.array(model.hi)
    lp.row_lower_, lp.row_upper_ = np.array(lo), np.array(hi)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
    lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                       for i in model.integer]
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("threads", 1)
    h.passModel(lp)
    if warm is not None:
        start = highspy.HighsSolution()
        start.col_value = list(warm)
        h.setSolution(start)
    began = time.perf_counter()
    h.run()
    seconds = time.perf_counter() - began
    info, status = h.getInfo(), h.modelStatusToString(h.getModelStatus())
    if info.primal_solution_status != 2:       # no feasible incumbent
        return Solution(status, None, info.mip_dual_bound * unit, math.inf, seconds, None, None, warm is not None,
                        regions)
    x = np.array(h.getSolution().col_value)
    ev, algos = model.decisions(x)
    return Solution(status, info.objective_function_value * unit, info.mip_dual_bound * unit, info.mip_gap,
                    seconds, ev, algos, warm is not None, regions)


@dataclass
class Reference:
    """The exact reference at one budget: ``plan`` (the faster of the MILP's plan and the heuristic's,
    both lowered, placed and simulated by the planner's code), ``milp`` (the MILP's own plan, None
    where it found none that fits), ``heuristic`` (``plan_memory``'s plan, None where it has none),
    the last ``solution`` with an incumbent, the ``rounds`` solved (the curve at the limit, the
    placement's two regions, then the curve lowered by what placement added) and the model's
    prediction of the MILP plan (``model_seconds``, ``model_bytes``: its arena peak)."""

    plan: object
    milp: object
    heuristic: object
    solution: Solution
    rounds: int
    model_seconds: float = None
    model_bytes: int = None


def solve_reference(schedule, budget, cost=None, config=None, time_limit=30.0, offload=True, rounds=4,
                    heuristic=None) -> Reference:
    """The MILP's best plan within ``budget`` bytes (persistent included) beside the heuristic's.

    ``config`` gives the profile and the algorithm setting (``MemoryConfig``'s); ``heuristic``: the
    heuristic's plan at this budget if already made. Raises MemoryBudgetError below the lower bound,
    and where neither the MILP nor the heuristic finds a plan."""
    config = config or MemoryConfig()
    cost = CachedCost(cost or ProfileCost(config.profile))
    touch = touches(schedule)
    options = algorithm_options(schedule, cost) if config.algorithms == "auto" else {}
    least = lower_bound(schedule, smallest(options))
    if budget < least:
        raise MemoryBudgetError(f"budget {format_bytes(budget)} ({budget} B) is below the lower bound "
                                f"{format_bytes(least)} ({least} B): one step's working set", least, budget)
    if heuristic is None:
        try:
            heuristic = plan_memory(schedule, MemoryConfig(budget=budget, profile=config.profile,
                                                           algorithms=config.algorithms), cost)
        except MemoryBudgetError:
            heuristic = None
    base = heuristic.baseline if heuristic is not None else None
    hints = {key: (ev.delay, ev.lead) for key, ev in (heuristic.evictions or {}).items()
             if ev.kind == "offload"} if heuristic is not None else {}
    model = Model(schedule, cost, touch, options, offload, hints)
    limit = budget - schedule.persistent_bytes
    # the heuristic's plan as the solver's first incumbent, where the model can express it and it fits
    seen = model.evaluate(heuristic.evictions or {}, heuristic.algos or {}) if heuristic is not None else None
    milp = solution = predicted = None
    lowered = 0                # what placement added to the curve's plans, taken off the curve's limit
    for done in range(1, rounds + 1):
        regions = done == 2    # the second round models the placement's two regions instead
        target = limit if regions else limit - lowered
        fits = seen is not None and (seen.regions if regions else seen.peak) <= target
        last = solve(model, target, time_limit, seen.x if fits else None, regions)
        if solution is None or last.evictions is not None:
            solution = last
        if last.evictions is None:
            if regions:
                continue
            break
        plan = make_plan(schedule, last.evictions, cost, "optimal", budget, base, touch,
                         {**fastest(options), **last.algos})
        if plan.arena_bytes <= limit:
            milp, predicted = plan, model.evaluate(last.evictions, last.algos)
            break
        if not regions:
            lowered += plan.arena_bytes - limit
    for p in (milp, heuristic):
        if p is not None:
            p.lower_bound_bytes = least
    fits = [p for p in (milp, heuristic) if p is not None and p.peak_bytes <= budget]
    if not fits:
        raise MemoryBudgetError(f"neither the MILP ({solution.status}) nor the planner finds a plan within "
                                f"{format_bytes(budget)} ({budget} B)", least, budget)
    best = min(fits, key=lambda p: p.simulation.seconds)
    return Reference(best, milp, heuristic, solution, done, *(predicted[:2] if predicted else (None, None)))


class OptimalPolicy:
    """A memory policy whose choice is the MILP's (at each arena limit it is asked for), started
    from the heuristic's plan at that limit: for ``MemoryConfig(policy=OptimalPolicy())``."""

    name = "optimal"

    def __init__(self, time_limit=30.0, offload=True):
        self.time_limit, self.offload = time_limit, offload

    def chooser(self, schedule, cost, touch, options, algos):
        """limit -> (evictions, algorithms) within ``limit`` arena bytes: the MILP plan's that placed
        within it, else the last solution's (the planner then asks again below); or (None, None)."""
        config = MemoryConfig(algorithms="auto" if options else "default")

        def choose(limit):
            try:
                ref = solve_reference(schedule, limit + schedule.persistent_bytes, cost, config, self.time_limit,
                                      self.offload)
            except MemoryBudgetError:
                return None, None
            if ref.milp is not None:
                return ref.milp.evictions, {**algos, **ref.milp.algos}
            if ref.solution.evictions is None:
                return None, None
            return ref.solution.evictions, {**algos, **ref.solution.algos}
        return choose
