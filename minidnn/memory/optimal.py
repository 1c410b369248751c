"""The exact reference: the fastest plan of the planner's decision space that places within a
budget, found by a MILP (HiGHS) that proposes candidates and the planner's own code that judges them.

The decisions: for every gap between two touches of an arena tensor (program.py's words), keep
it, drop it and recompute it before the touch that closes the gap, or offload it with one of a
few timings (``OFFLOAD_TIMINGS``, and the heuristic's own where it has one); and for every step
with several algorithms, which one it runs. A plan is what ``planner.make_plan`` makes of them:
lowered, placed (packed: where the default placement is over the budget and fragments, the
smallest of placement.py's three orders) and simulated; it fits where its placed peak is within
the budget.

The model (optimal_model.py, optimal_time.py) is a relaxation of that: for given decisions its
memory at every stage is at most the lowered program's there (so at most the placed arena), and
its time is at most the simulator's (equal to it but where a chain's order decides when a copy
is waited for). Its variables:

- ``d[t,g]`` drop, ``v[t,g,k]`` offload with timing ``k`` (binary; ``o[t,g]`` their sum): the
  gap's decision; ``x[s,a]``: step ``s`` runs algorithm ``a``: these are the decisions;
- ``R[s,p]``: schedule step ``p`` (a forward) runs again in stage ``s``, as the lowering's restore
  chain does: for a dropped gap that closes at ``s``, and for each input of a rerun step that is
  not on the device then (Checkmate's ``R``); ``phi[s,u]``: the chain prefetches ``u`` from a host
  copy that is still valid instead; ``z[s,p,a]``: a rerun with its step's algorithm;
- ``F[s,a,b]``: reruns ``a`` and ``b`` run as one fused pass (op.fused), which costs what ``b``
  costs alone; ``h``, ``w``: an input a rerun reads, an output it writes, that the chain restores;
- event times on the two streams (optimal_time.py), the step's time ``T`` the objective.

Each relation bounds a variable from the side its cost pushes against (a rerun is forced by
what it restores, a held value by its reader, an event time by what precedes it), so the
continuous variables take their exact values at an optimum without big-M constraints, except
the waits for copies that may not run.

The search (:func:`solve_reference`): the MILP's optimum is a decision vector whose modelled time
is a lower bound on the simulated time of every plan still in the space. Its plan is made; if it
places within the budget and is the fastest yet, it is kept; either way a no-good cut removes
exactly that decision vector (where it placed over the budget, with every vector whose program has
the same buffers: the algorithms of the same workspace), and a row keeps the MILP to modelled times below the fastest plan
kept. The search ends when the fastest plan is no slower than the MILP's bound (it is then
optimal over the decision space: every plan left is modelled, so simulated, at least as slow),
when the MILP has no solution left (the same), or on the time limit: then it reports the proven
lower bound and the gap, never "optimal". The floor (bound.py), under every plan within the
budget, is a bound from the start: a heuristic plan at the floor is optimal without a solve, and
where the MILP proves less before its time runs out, the floor is the bound reported.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
try:
    import highspy
except ImportError as e:          # the research extra: training and planning do not need it
    raise ImportError("the exact reference (minidnn.memory.optimal) needs HiGHS's Python binding: "
                      "pip install 'minidnn[research]'") from e
from scipy import sparse

from ..errors import MemoryBudgetError
from ..schedule import aligned
from .bound import step_time_floor
from .config import MemoryConfig, format_bytes
from .costmodel import CachedCost, ProfileCost
from .optimal_cuts import cut_terms
from .optimal_model import PAIRED_TIMINGS, Model
from .planner import algorithm_options, fastest, lower_bound, make_plan, plan_memory, smallest
from .facts import Facts

# HiGHS's tolerance on the rows of a MIP solution (its default 1e-6 rejects, as "Solve error", the
# solutions of some models whose waits for copies carry a constant M of a few step times: 2e-6 over);
# the rows are scaled to about one, so a modelled time may be below its exact value by about that.
MIP_FEASIBILITY = 1e-5
# Seconds are compared relative to the step, at the solver's tolerance: a plan within it of the
# bound is the optimum (3 ns of a 300 us step).
TOLERANCE = MIP_FEASIBILITY
# HiGHS stops a solve once its incumbent is within this relative gap of its bound (default 1e-4): the
# search needs the true optimum of each solve, to below TOLERANCE.
MIP_REL_GAP = 1e-8
# Solves with the limit lowered, after a solution placed over the budget, before the search goes on:
# placement adds to the live peak (first fit fragments), 20% on a 24-node DAG at 80% of its
# liveness peak, so that many solutions at the limit place over it, each one solve; a solve whose
# limit leaves room for what placement adds finds one that places, and its time removes the rest.
PROBES = 3
# HiGHS's statuses that are an answer (a solution, a proof that none is left, or the time limit's stop)
SOLVED = ("Optimal", "Infeasible", "Time limit reached")


@dataclass
class Solution:
    """One MILP solve: ``status`` (HiGHS's words, e.g. "Optimal", "Time limit reached",
    "Infeasible"), ``objective`` (the incumbent's modelled seconds, None without one), ``bound``
    (the proven lower bound on the modelled seconds of every decision left; inf where none is),
    ``seconds`` (solve time), and the incumbent as decision values and as minidnn decisions."""

    status: str
    objective: float
    bound: float
    seconds: float
    x: np.ndarray = None
    evictions: dict = None
    algos: dict = None


class Solver:
    """The MILP of ``model`` within ``limit`` arena bytes, in one HiGHS instance: :meth:`cut` removes
    a decision vector, :meth:`below` keeps modelled times below a bound, :meth:`solve` solves what
    is left."""

    def __init__(self, model, limit):
        self.model = model
        self.unit = unit = sum(model.secs) or 1.0       # seconds and bytes scaled to about one
        rows = model.rows(limit)
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
        cost[model.timeline.T] = 1.0 / unit
        lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost, np.array(model.lo), np.array(model.hi)
        lp.row_lower_, lp.row_upper_ = np.array(lo), np.array(hi)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                           for i in model.integer]
        self.h = h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", 1)
        h.setOptionValue("mip_rel_gap", MIP_REL_GAP)
        h.setOptionValue("mip_feasibility_tolerance", MIP_FEASIBILITY)
        h.passModel(lp)
        self.ceiling = None                  # the row that keeps T below the fastest plan kept

    def cut(self, terms, need):
        """Add the row sum(terms[v] * v) >= need (optimal_cuts.cut_terms)."""
        idx = np.array(sorted(terms), np.int32)
        self.h.addRow(need, highspy.kHighsInf, len(idx), idx, np.array([terms[v] for v in idx]))

    def below(self, seconds):
        """Keep the modelled time below ``seconds`` (less TOLERANCE)."""
        upper = seconds * (1.0 - TOLERANCE) / self.unit
        if self.ceiling is None:
            self.ceiling = self.h.getNumRow()
            self.h.addRow(-highspy.kHighsInf, upper, 1, np.array([self.model.timeline.T], np.int32), np.array([1.0]))
        else:
            self.h.changeRowBounds(self.ceiling, -highspy.kHighsInf, upper)

    def solve(self, time_limit) -> Solution:
        h = self.h
        h.setOptionValue("time_limit", max(float(time_limit), 0.0))
        began = time.perf_counter()
        h.run()
        seconds = time.perf_counter() - began
        info, status = h.getInfo(), h.modelStatusToString(h.getModelStatus())
        if status == "Infeasible":
            return Solution(status, None, math.inf, seconds)
        bound = info.mip_dual_bound * self.unit
        if info.primal_solution_status != 2:       # no feasible incumbent
            return Solution(status, None, bound, seconds)
        x = np.array(h.getSolution().col_value)
        ev, algos = self.model.decisions(x)
        return Solution(status, info.objective_function_value * self.unit, bound, seconds, x, ev, algos)


@dataclass
class Reference:
    """The exact reference at one budget. ``plan``: the fastest plan found that places within the
    budget (the MILP's candidates and the heuristic's plan, each lowered, placed and simulated by
    the planner's code), None where none places; ``heuristic``: ``plan_memory``'s plan (None where
    it has none); ``bound``: a proven lower bound on the simulated seconds of every plan of the
    decision space within the budget (inf: none places); ``optimal``: ``plan`` is within TOLERANCE
    of it (else the search stopped on its time limit); ``candidates``: MILP solutions tried,
    ``misplaced`` of them placed over the budget; ``model_seconds``: the model's time for ``plan``
    (a lower bound on its simulated time; None where the model does not express it); ``solves``:
    the MILP's solve times; ``seconds``: the whole search's; ``stop``: HiGHS's status of the last solve."""

    plan: object
    heuristic: object
    bound: float
    optimal: bool
    candidates: int = 0
    misplaced: int = 0
    model_seconds: float = None
    solves: tuple = ()
    seconds: float = 0.0
    stop: str = "Optimal"

    @property
    def status(self) -> str:
        """"optimal" (or "none places": proven that no plan of the space places), "time limit", or
        the solver's own words where it stopped otherwise; never "optimal" without the proof."""
        if self.optimal:
            return "optimal" if self.plan is not None else "none places"
        return "time limit" if self.stop == "Time limit reached" else f"stopped: {self.stop}"

    @property
    def gap(self) -> float:
        """The best plan's seconds over the proven bound, minus one (inf without a plan)."""
        if self.plan is None:
            return math.inf
        return self.plan.simulation.seconds / self.bound - 1 if self.bound > 0 else math.inf


def solve_reference(schedule, budget, cost=None, config=None, time_limit=60.0, offload=True,
                    heuristic=None, timings=PAIRED_TIMINGS, hinted=True) -> Reference:
    """The fastest plan of the decision space within ``budget`` bytes (persistent included), or the
    best found and a proven bound where ``time_limit`` seconds (the whole search) run out.

    ``config`` gives the profile and the algorithm setting (``MemoryConfig``'s); ``heuristic``: the
    heuristic's plan at this budget if already made; ``timings``: the offload Evicts a gap may take
    (optimal_model's PAIRED_TIMINGS or INDEPENDENT_TIMINGS; with ``hinted``, the heuristic's own
    for its gaps too: its plan is then one of the decisions). Raises MemoryBudgetError below the lower bound."""
    began = time.perf_counter()
    config = config or MemoryConfig()
    cost = CachedCost(cost or ProfileCost(config.profile))
    facts = Facts(schedule)
    options = pareto(algorithm_options(schedule, cost, pinned=config.algorithms != "auto"))
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
    model = Model(facts, cost, options, offload, hints_of(heuristic) if hinted else {}, timings)
    search = _Search(facts, cost, options, budget, heuristic, least, model)
    # the floor (bound.py) is under every plan within the budget: a plan at it is optimal unsolved,
    # and a search the time limit stops keeps it as its bound where the MILP has proven less
    floor = step_time_floor(schedule, budget, cost).seconds
    solves, bound, stop = [], None, "Optimal"
    if math.isinf(floor) or (search.best is not None and search.best.simulation.seconds <= floor * (1 + TOLERANCE)):
        bound = floor if search.best is None else min(floor, search.best.simulation.seconds)
    proven = 0.0          # a lower bound on the modelled time of every decision left: each solve's rises
    while bound is None:
        sol = search.solve(time_limit - (time.perf_counter() - began))
        solves.append(sol.seconds)
        stop = sol.status
        proven = max(proven, sol.bound)
        best = search.best
        if sol.x is None:                         # nothing left (a proof), or out of time
            bound = proven if best is None else min(proven, best.simulation.seconds)
            break
        plan = search.check(sol.evictions, sol.algos)
        if plan is not None and plan.arena_bytes > search.limit and search.ceiling() > sol.objective * (1 + TOLERANCE):
            solves += search.probe(plan.arena_bytes - search.limit, time_limit - (time.perf_counter() - began))
        best = search.best
        if sol.status != "Optimal":               # out of time, with an incumbent
            bound = min(proven, best.simulation.seconds) if best is not None else proven
        elif best is not None and best.simulation.seconds <= sol.objective * (1 + TOLERANCE):
            bound = min(sol.objective, best.simulation.seconds)   # nothing left is modelled faster
    best = search.best
    bound = max(bound, floor) if best is None else min(max(bound, floor), best.simulation.seconds)
    optimal = best is None and math.isinf(bound) or (
        best is not None and best.simulation.seconds <= bound * (1 + TOLERANCE))
    if best is not None:
        best.lower_bound_bytes = least
    seen = model.evaluate(best.evictions or {}, best.algos or {}) if best is not None else None
    return Reference(best, heuristic, bound, optimal, search.candidates, search.misplaced,
                     seen.seconds if seen is not None else None, tuple(solves), time.perf_counter() - began,
                     stop)


class _Search:
    """The plans the search has made: each decision vector once (lowered, placed and simulated by
    ``make_plan``), the fastest that places within the budget, and the cuts that remove them from
    the MILP."""

    def __init__(self, facts, cost, options, budget, heuristic, least, model):
        schedule = facts.schedule
        self.schedule, self.cost, self.facts, self.options = schedule, cost, facts, options
        self.budget, self.least, self.model = budget, least, model
        self.limit = budget - schedule.persistent_bytes
        self.base = heuristic.baseline if heuristic is not None else None
        self.best = heuristic if heuristic is not None and heuristic.peak_bytes <= budget else None
        self.seen, self.cuts = set(), []
        self.candidates = self.misplaced = 0
        self.solver = Solver(model, self.limit)

    def check(self, evictions, algos):
        """Make the plan of these decisions (once), keep it where it is the fastest that places,
        and cut it from the main solver (and keep the cut for probes); the plan, None where it was
        made before."""
        key = (frozenset(evictions.items()), tuple(sorted((s, a.name) for s, a in algos.items())))
        if key in self.seen:
            return None
        self.seen.add(key)
        plan = make_plan(self.schedule, evictions, self.cost, "optimal", budget=self.budget, baseline=self.base,
                         facts=self.facts, algos={**fastest(self.options), **algos}, least=self.least,
                         pack=True)
        self.candidates += 1
        over = plan.arena_bytes > self.limit
        if over:
            self.misplaced += 1
        elif self.best is None or plan.simulation.seconds < self.best.simulation.seconds:
            self.best = plan
        cut = cut_terms(self.model, self.model.encode(evictions, algos), over)
        self.cuts.append(cut)
        self.solver.cut(*cut)
        return plan

    def solve(self, seconds_left) -> Solution:
        """The main solver's next solution below the fastest plan; where HiGHS fails on the instance
        it has been given cut by cut ("Solve error": the rows' numerics after many cuts), a fresh
        one with the same rows, once."""
        for fresh in (False, True):
            if fresh:
                self.solver = Solver(self.model, self.limit)
                for terms, need in self.cuts:
                    self.solver.cut(terms, need)
            if self.best is not None:
                self.solver.below(self.best.simulation.seconds)
            sol = self.solver.solve(seconds_left)
            if sol.status in SOLVED:
                return sol
        return sol

    def ceiling(self) -> float:
        return self.best.simulation.seconds if self.best is not None else math.inf

    def probe(self, overshoot, seconds_left) -> list:
        """Look for a plan that places, where the MILP's solutions place over the budget: solve
        again with the limit lowered by what placement added (``overshoot``), and by what it adds
        to that solution in turn, at most PROBES times or until one places. Only a way to find
        fast plans early (the proof is the main solver's); the solve times."""
        began, times = time.perf_counter(), []
        limit = self.limit - overshoot
        for _ in range(PROBES):
            left = seconds_left - (time.perf_counter() - began)
            if limit <= 0 or left <= 0:
                break
            solver = Solver(self.model, limit)
            for terms, need in self.cuts:
                solver.cut(terms, need)
            if self.best is not None:
                solver.below(self.best.simulation.seconds)
            sol = solver.solve(left)
            times.append(sol.seconds)
            if sol.x is None:
                break
            plan = self.check(sol.evictions, sol.algos)
            if plan is None or plan.arena_bytes <= self.limit:
                break
            limit -= plan.arena_bytes - self.limit
        return times


def pareto(options) -> dict:
    """``options`` (planner.algorithm_options') without the algorithms another one matches in seconds
    with no more (aligned) workspace: such an algorithm is never faster and holds at least as much
    at every step, so the reference's decisions leave it out."""
    out = {}
    for s, opts in options.items():
        kept, least = [], math.inf
        for sec, algo in sorted(opts, key=lambda p: (p[0], aligned(p[1].workspace))):
            if aligned(algo.workspace) < least:
                kept.append((sec, algo))
                least = aligned(algo.workspace)
        out[s] = kept
    return out


def hints_of(plan) -> dict:
    """{(tensor, gap): Evict} of ``plan``'s offloads: timings the model offers beside its own, so
    that the heuristic's plan is one of its decisions."""
    if plan is None:
        return {}
    return {key: ev for key, ev in (plan.evictions or {}).items() if ev.kind == "offload"}


class OptimalPolicy:
    """A memory policy whose choice is the exact reference's (at each arena limit it is asked for):
    for ``MemoryConfig(policy=OptimalPolicy())``."""

    name = "optimal"

    def __init__(self, time_limit=60.0, offload=True):
        self.time_limit, self.offload = time_limit, offload

    def chooser(self, facts, cost, options, algos):
        """limit -> (evictions, algorithms) of the reference's plan within ``limit`` arena bytes, or
        (None, None) where it has none."""
        schedule = facts.schedule
        config = MemoryConfig(algorithms="auto" if options else "default")

        def choose(limit):
            try:
                ref = solve_reference(schedule, limit + schedule.persistent_bytes, cost, config, self.time_limit,
                                      self.offload)
            except MemoryBudgetError:
                return None, None
            if ref.plan is None:
                return None, None
            return ref.plan.evictions, {**algos, **ref.plan.algos}
        return choose
