"""Planning: a schedule, a budget and a cost model in; a Plan out. No kernel runs here.

``plan_memory`` lowers the schedule with the evictions a policy chooses,
places every residency in the arena, and verifies the result against the
budget; it raises MemoryBudgetError with the smallest feasible budget when
none fits. Policies are objects with one method (policies.py); the default
``auto`` is the swap/recompute hybrid of greedy.py, planned from several seeds
by the search of search.py.
"""
from __future__ import annotations

import dataclasses
import functools
import gc
from collections import OrderedDict

from ..errors import MemoryBudgetError
from ..schedule import aligned
from .config import MemoryConfig, format_bytes
from .costmodel import CachedCost, ProfileCost
from .greedy import AutoPolicy, Greedy  # noqa: F401  (AutoPolicy: the planner's own policy, named here too)
from .knobs import Knobs
from .placement import place_program
from .plan import Plan
from .facts import Facts
from .program import lower
from .search import Problem, Search
from .simulator import memory_curve, simulate


def algorithm_options(schedule, cost, pinned=False) -> dict:
    """step index -> [(seconds, Algo)] fastest first, for steps whose op offers several algorithms,
    or one whose workspace is not the step's own (a device's algorithm: cuDNN's one option for a
    layer must not be charged the schedule's workspace, the CPU default's im2col). ``pinned``
    (``algorithms="default"``): the first algorithm listed only, so that no budget changes it."""
    out = {}
    lister = getattr(cost, "algorithms", None)   # a backend's cost model may name its own (cuDNN's on CUDA)
    for s in schedule.steps:
        if s.kind not in ("forward", "backward") or s.node is None:
            continue
        n = s.node
        ins, outs = [v.spec for v in n.inputs], [o.spec for o in n.outputs]
        algos = lister(n.op, ins, outs, s.kind) if lister else n.op.algorithms(ins, outs, s.kind)
        algos = algos[:1] if pinned else algos
        own = schedule.tensors[s.ws].nbytes if s.ws is not None else 0
        if len(algos) > 1 or (algos and algos[0].workspace != own):
            out[s.index] = sorted(((cost.step_seconds(schedule, s, a), a) for a in algos),
                                  key=lambda p: (p[0], p[1].workspace))
    return out


def fastest(options) -> dict:
    return {i: opts[0][1] for i, opts in options.items()}


def smallest(options) -> dict:
    return {i: min(opts, key=lambda p: (p[1].workspace, p[0]))[1] for i, opts in options.items()}


def lower_bound(schedule, algos=None) -> int:
    """Persistent bytes + the largest working set of any single step: what it touches and the
    workspace of its smallest algorithm (``algos``: step index -> Algo)."""
    algos = algos or {}
    tensors, nbytes = schedule.tensors, schedule.tensor_bytes.tolist()   # aligned, by tensor id
    best = 0
    for s in schedule.steps:
        ts = {t for t in s.touched if not tensors[t].persistent and t != s.ws}
        ws = algos[s.index].workspace if s.index in algos else (tensors[s.ws].nbytes if s.ws is not None else 0)
        best = max(best, sum(map(nbytes.__getitem__, ts)) + aligned(ws))
    return schedule.persistent_bytes + best


def make_plan(schedule, evictions, cost, policy, *, budget=None, baseline=None, facts=None, algos=None,
              program=None, simulation=None, keep_within=0, arena_limit=None, liveness=None, least=None,
              baseline_algos=None, base=None, checkpoints=0, pack=False) -> Plan:
    """Lower (unless ``program`` is that lowering already), place and simulate (unless ``simulation``
    is that replay already, or the arena exceeds ``arena_limit``) ``evictions`` with ``algos``; the
    Plan (not yet checked against a budget). ``facts``: the schedule's facts.Facts (None: derived
    here). ``liveness``, ``least``: the schedule's liveness peak and lower bound (the liveness peak
    is this plan's own where nothing is evicted). ``base``, ``checkpoints``: as program.lower's (the
    same Program, sooner). ``pack``: the arena packed tighter where it is over what ``budget`` leaves
    (placement.place_program's)."""
    program = program if program is not None else lower(schedule, evictions, facts, algos, keep_within, base,
                                                         checkpoints)
    persistent = schedule.persistent_bytes
    offsets, arena, how = place_program(program, None if budget is None else budget - persistent, pack)
    if liveness is None and not evictions:
        liveness = persistent + int(memory_curve(program).max(initial=0))
    replay = cost is not None and (arena_limit is None or arena <= arena_limit)
    sim = simulation if simulation is not None or not replay else simulate(program, schedule, cost, algos=algos)
    return Plan(schedule=schedule, program=program, offsets=offsets, persistent_bytes=persistent,
                arena_bytes=arena, ideal_bytes=persistent + schedule.arena_bytes_no_reuse,
                liveness_peak_bytes=liveness, lower_bound_bytes=least, budget=budget, policy=policy, simulation=sim,
                baseline=baseline, evictions=dict(evictions), host_bytes=program.host_bytes, placement=how,
                algos=dict(algos or {}), keep_within=keep_within, baseline_algos=baseline_algos)


def _collector_paused(fn):
    """Run ``fn`` with Python's cyclic garbage collector paused, and restore it after. Planning
    builds some 10^5 objects that all stay alive until it returns (steps, residencies, candidate
    rows); the collector's full passes over them find nothing to free and took a third of a
    deep network's planning time. Reference counting still frees everything as usual."""
    @functools.wraps(fn)
    def paused(*args, **kwargs):
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()
    return paused


@_collector_paused
def plan_memory(schedule, config: MemoryConfig = None, cost=None, knobs: Knobs = Knobs()) -> Plan:
    """The plan for ``schedule`` under ``config``: its budget, policy and device profile (``knobs``:
    the search's thresholds).

    Every step starts with its fastest algorithm; the unlimited plan keeps them.
    Under a budget the policy evicts tensors and (the ``auto`` policy) trades
    algorithms for smaller workspaces; the simulator picks the fastest variant.
    """
    config = config or MemoryConfig()
    cost = CachedCost(cost or ProfileCost(config.profile))
    facts = Facts(schedule)
    options = algorithm_options(schedule, cost, pinned=config.algorithms != "auto")
    quick = fastest(options)
    unlimited = lower(schedule, {}, facts, quick)
    baseline = simulate(unlimited, schedule, cost, algos=quick)
    liveness = schedule.persistent_bytes + int(memory_curve(unlimited).max(initial=0))
    least_bytes = lower_bound(schedule, smallest(options))
    budget = config.resolve(liveness)
    # the unlimited plan is placed only where it may be the answer: its arena is at least its liveness peak
    if budget is None or liveness <= budget or config.policy == "none":
        base = make_plan(schedule, {}, cost, "none", budget=budget, baseline=baseline, facts=facts, algos=quick,
                         program=unlimited, simulation=baseline, liveness=liveness, least=least_bytes)
        if budget is None or base.peak_bytes <= budget or config.policy == "none":
            if budget is not None and base.peak_bytes > budget:
                raise MemoryBudgetError(
                    f"policy 'none' evicts nothing: its peak, the liveness peak placed, {format_bytes(base.peak_bytes)} "
                    f"({base.peak_bytes} B) is above the budget {format_bytes(budget)} ({budget} B); use "
                    f"policy 'auto' or a budget of at least {base.peak_bytes} B", base.peak_bytes, budget)
            return base
    policy = config.policy_object()

    def maker(pack):
        def make(ev, algos, program=None, simulation=None, keep_within=0, arena_limit=None, base=None):
            return make_plan(schedule, ev, cost, policy.name, budget=budget, baseline=baseline, facts=facts,
                             algos=algos, program=program, simulation=simulation, keep_within=keep_within,
                             arena_limit=arena_limit, liveness=liveness, least=least_bytes, baseline_algos=quick,
                             base=base, checkpoints=knobs.lowering_checkpoints, pack=pack)
        return make
    build = Builds(maker(False), knobs.kept_builds)

    problem = Problem(facts, cost, budget - schedule.persistent_bytes, options, quick, build, baseline.seconds,
                      knobs, packed=lambda: Builds(maker(True), knobs.kept_builds))
    search = Search(problem)
    best = search.run(policy)
    if best is not None:
        return dataclasses.replace(best, log=tuple(search.log))
    least = minimum_plan(facts, cost, build, options)
    if least.peak_bytes > budget:   # where evicting fragments more than it frees, evicting nothing needs less
        full = make_plan(schedule, {}, None, "none", facts=facts, algos=quick, program=unlimited)
        least = min((least, full), key=lambda p: p.peak_bytes)
        _infeasible(budget, least.peak_bytes, least)
    if policy.name != "auto":
        raise MemoryBudgetError(
            f"the {policy.name!r} policy finds no plan within {format_bytes(budget)} ({budget} B); the planner's "
            f"own minimum is {format_bytes(least.peak_bytes)} ({least.peak_bytes} B): use policy 'auto' or a "
            f"larger budget", least.peak_bytes, budget)
    return dataclasses.replace(least, log=tuple(search.log))


class Builds:
    """``make(evictions, algos, program, simulation, keep_within, arena_limit, base)`` (make_plan for one
    problem) with the last ``size`` distinct decisions (evictions, algorithms, horizon) kept: the
    search's repairs ask for the same decisions again and again (the copy timing of a plan that
    two repairs start from, the seeds whose plans end alike; a third of ResNet-18 b512's staged
    iteration's trials were new), and a lowering, its placement and its replay depend on those
    decisions alone. Each call returns a Plan of its own, equal to what ``make`` returns: replayed
    where ``arena_limit`` allows it (a kept plan that was not is replayed now), not replayed where
    it does not. ``base``: a Program whose lowering that of ``ev`` may start from (program.lower's:
    the plan a repair's trials change a few decisions of)."""

    def __init__(self, make, size):
        self.make, self.size = make, size
        self.kept = OrderedDict()           # decisions -> the Plan made for them, least recent first

    def __call__(self, ev, algos, program=None, simulation=None, keep_within=0, arena_limit=None, base=None):
        key = (frozenset(ev.items()), frozenset((algos or {}).items()), keep_within)
        plan = self.kept.get(key)
        replay = arena_limit is None or plan is None or plan.arena_bytes <= arena_limit
        if plan is None or (replay and plan.simulation is None):
            plan = self.make(ev, algos, program if plan is None else plan.program,
                             simulation, keep_within, arena_limit, base)
            self.kept[key] = plan
            if len(self.kept) > self.size:
                self.kept.popitem(last=False)
        else:
            self.kept.move_to_end(key)
        return dataclasses.replace(plan, simulation=plan.simulation if replay else None)


def unlimited_seconds(schedule, config: MemoryConfig = None, cost=None) -> float:
    """The predicted seconds of ``schedule`` with unlimited memory and its fastest algorithms (what a
    split step's overhead is measured against: the step it splits)."""
    config = config or MemoryConfig()
    cost = CachedCost(cost or ProfileCost(config.profile))
    quick = fastest(algorithm_options(schedule, cost, pinned=config.algorithms != "auto"))
    return simulate(lower(schedule, {}, None, quick), schedule, cost, algos=quick).seconds


def minimum_plan(facts, cost, build, options):
    """Everything evictable evicted, just in time, smallest workspaces: the least this planner needs."""
    return build(Greedy(facts, cost, True, True).all(), smallest(options))


@_collector_paused
def minimum_bytes(schedule, config=None, cost=None) -> int:
    """The smallest budget ``plan_memory`` meets for ``schedule`` (what MemoryBudgetError reports)."""
    config = config or MemoryConfig()
    cost = CachedCost(cost or ProfileCost(config.profile))
    facts = Facts(schedule)
    options = algorithm_options(schedule, cost, pinned=config.algorithms != "auto")
    least = minimum_plan(facts, cost, lambda ev, al: make_plan(schedule, ev, None, "minimum", facts=facts, algos=al),
                         options)
    full = make_plan(schedule, {}, None, "none", facts=facts, algos=fastest(options))
    return min(least.peak_bytes, full.peak_bytes)


def _infeasible(budget, minimum, plan):
    curve = plan.live_curve
    at = max(range(len(curve)), key=curve.__getitem__)
    raise MemoryBudgetError(
        f"budget {format_bytes(budget)} ({budget} B) is below the minimum feasible "
        f"{format_bytes(minimum)} ({minimum} B), set by step {at} ({plan.steps[at].label})", minimum, budget)
