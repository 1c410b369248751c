"""Planning: a schedule, a budget and a cost model in; a Plan out. No kernel runs here.

``plan_memory`` lowers the schedule with the evictions a policy chooses,
places every residency in the arena, and verifies the result against the
budget; it raises MemoryBudgetError with the smallest feasible budget when
none fits. Policies are objects (see policies.py); the default ``auto`` is the
swap/recompute hybrid in this file's :class:`AutoPolicy`.
"""
from __future__ import annotations

import functools
import gc
import math


from ..errors import MemoryBudgetError
from ..schedule import aligned
from .baselines import CheckpointSqrt
from .config import MemoryConfig, format_bytes
from .costmodel import CachedCost, ProfileCost
from .placement import place_program
from .greedy import Greedy
from .plan import Plan
from .program import lower, touches
from .simulator import memory_curve, simulate
from .transfers import timed_transfers


def algorithm_options(schedule, cost) -> dict:
    """step index -> [(seconds, Algo)] fastest first, for steps whose op offers several algorithms."""
    out = {}
    lister = getattr(cost, "algorithms", None)   # a backend's cost model may name its own (cuDNN's on CUDA)
    for s in schedule.steps:
        if s.kind not in ("forward", "backward") or s.node is None:
            continue
        n = s.node
        ins, outs = [v.spec for v in n.inputs], [o.spec for o in n.outputs]
        algos = lister(n.op, ins, outs, s.kind) if lister else n.op.algorithms(ins, outs, s.kind)
        if len(algos) > 1:
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


def make_plan(schedule, evictions, cost, policy, budget=None, baseline=None, touch=None, algos=None,
              program=None, simulation=None, keep_within=0, arena_limit=None) -> Plan:
    """Lower (unless ``program`` is that lowering already), place and simulate (unless ``simulation``
    is that replay already, or the arena exceeds ``arena_limit``) ``evictions`` with ``algos``; the
    Plan (not yet checked against a budget)."""
    program = program if program is not None else lower(schedule, evictions, touch, algos, keep_within)
    offsets, arena, how = place_program(program)
    for k, r in enumerate(program.residencies):
        r.offset = offsets[k]
    persistent = schedule.persistent_bytes
    replay = cost is not None and (arena_limit is None or arena <= arena_limit)
    sim = simulation if simulation is not None or not replay else simulate(program, schedule, cost, algos=algos)
    return Plan(schedule=schedule, program=program, offsets=offsets, persistent_bytes=persistent,
                arena_bytes=arena, ideal_bytes=persistent + schedule.arena_bytes_no_reuse,
                liveness_peak_bytes=persistent + int(memory_curve(program).max(initial=0)) if not evictions else None,
                budget=budget, policy=policy, simulation=sim, baseline=baseline, evictions=dict(evictions),
                host_bytes=program.host_bytes, placement=how, algos=dict(algos or {}), keep_within=keep_within)


class AutoPolicy:
    """minidnn's planner: per gap, offload or recompute by predicted cost, greedily at the peak.

    Repeatedly takes the step where the most bytes are live and evicts, among
    the tensors idle across it, the one that frees the most bytes per second
    of predicted overhead: an offload costs the part of its two transfers that
    the compute inside its gap cannot hide; a recomputation costs the chain its
    lowering runs (greedy.py: the curve it plans against is the lowered
    program's). Exact placement is checked after; fragmentation tightens the
    target.
    ``plan_memory`` then times the copies and turns recomputations into
    offloads where the copy stream has room left (transfers.py).
    """

    def __init__(self, recompute=True, offload=True, name="auto", copies_free=False):
        self.recompute, self.offload, self.name = recompute, offload, name
        self.copies_free = copies_free      # rank offloads as if copies took nothing from compute

    @property
    def hybrid(self) -> bool:
        """Free to choose between offloading and recomputing."""
        return self.offload and self.recompute

    def evictions(self, schedule, limit, cost, touch):
        return self.choose(schedule, limit, cost, touch, {}, {})[0]

    def choose(self, schedule, limit, cost, touch, options, algos):
        """(evictions, algorithms) meeting ``limit``: algorithms start at ``algos`` (the fastest)
        and are traded for smaller workspaces where that costs less than evicting."""
        return self.chooser(schedule, cost, touch, options, algos)(limit)

    def chooser(self, schedule, cost, touch, options, algos):
        """``choose`` for one schedule at any number of limits: a function limit -> (evictions,
        algorithms). The greedy's decisions do not depend on the limit (it only says when to stop),
        so one run of it, continued as lower limits are asked for, answers every limit."""
        return Greedy(schedule, cost, touch, self.recompute, self.offload, options, algos,
                           self.copies_free).greedy


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
def plan_memory(schedule, config: MemoryConfig = None, cost=None) -> Plan:
    """The plan for ``schedule`` under ``config``: its budget, policy and device profile.

    Every step starts with its fastest algorithm; the unlimited plan keeps them.
    Under a budget the policy evicts tensors and (the ``auto`` policy) trades
    algorithms for smaller workspaces; the simulator picks the fastest variant.
    """
    config = config or MemoryConfig()
    cost = CachedCost(cost or ProfileCost(config.profile))
    touch = touches(schedule)
    options = algorithm_options(schedule, cost) if config.algorithms == "auto" else {}
    quick = fastest(options)
    unlimited = lower(schedule, {}, touch, quick)
    baseline = simulate(unlimited, schedule, cost, algos=quick)
    liveness = schedule.persistent_bytes + int(memory_curve(unlimited).max(initial=0))
    least_bytes = lower_bound(schedule, smallest(options))
    budget = config.resolve(liveness)
    # the unlimited plan is placed only where it may be the answer: its arena is at least its liveness peak
    if budget is None or liveness <= budget or config.policy == "none":
        base = make_plan(schedule, {}, cost, "none", touch=touch, algos=quick, program=unlimited,
                         simulation=baseline)
        base.baseline, base.lower_bound_bytes, base.budget = baseline, least_bytes, budget
        if budget is None or base.peak_bytes <= budget or config.policy == "none":
            if budget is not None and base.peak_bytes > budget:
                _infeasible(budget, base.peak_bytes, base)
            return base
    policy = config.policy_object()
    limit = budget - schedule.persistent_bytes

    def build(ev, algos, program=None, simulation=None, keep_within=0, arena_limit=None):
        p = make_plan(schedule, ev, cost, policy.name, budget, baseline, touch, algos, program, simulation,
                      keep_within, arena_limit)
        p.liveness_peak_bytes, p.lower_bound_bytes = liveness, least_bytes
        p.baseline_algos = quick
        return p

    best = beat = None                   # the fastest plan, and the fastest before its transfers were retimed

    memo = {}                            # lowerings by decisions, for every search below

    def fitted(variant, convert, prune=True, choose=None):
        nonlocal best, beat
        # one chooser for every horizon: the greedy's decisions do not depend on the lowering's horizon
        choose = choose or _chooser(variant, schedule, cost, touch, options, quick)
        plan = _fit(choose, schedule, limit, cost, touch, build, beat=beat if prune else None, memo=memo)
        if plan is not None and _rechains(plan):
            plan = _keep_chains(choose, schedule, limit, cost, touch, build, plan, memo)
        if plan is None:
            return
        beat = min(beat or math.inf, plan.simulation.seconds)
        plan = timed_transfers(plan, schedule, cost, limit, touch, build, convert,
                               best.simulation.seconds if best is not None else None)
        if best is None or plan.simulation.seconds < best.simulation.seconds:
            best = plan

    for variant in policy_variants(policy, cost):
        fitted(variant, convert=isinstance(variant, AutoPolicy) and variant.hybrid)
    hybrid = isinstance(policy, AutoPolicy) and policy.hybrid
    sqrt = CheckpointSqrt()
    if (hybrid and best is not None and best.simulation.seconds > 1.1 * baseline.seconds
            and sqrt.rework(schedule, touch) <= SQRT_REWORK):
        # where the greedy's plan costs a tenth of a step and more (copies hide little: a fast GPU
        # on a slow link), Chen et al.'s sqrt(n) segments are planned too, their recomputations
        # offloaded where the copy stream has room (not pruned: their first lowering recomputes
        # chains again and again, which the horizon search then removes) - unless that first
        # lowering would be too long to plan in seconds (a thousand-layer network's)
        segments = sqrt.evictions(schedule, math.inf, cost, touch, quick)   # the same for every target
        fitted(sqrt, convert=True, prune=False, choose=lambda target: (segments, quick))
    if best is not None:
        return best
    least = minimum_plan(schedule, cost, touch, build, options)
    if least.peak_bytes > budget:   # where evicting fragments more than it frees, evicting nothing needs less
        full = make_plan(schedule, {}, None, "none", touch=touch, algos=quick, program=unlimited)
        least = min((least, full), key=lambda p: p.peak_bytes)
        _infeasible(budget, least.peak_bytes, least)
    if policy.name != "auto":
        raise MemoryBudgetError(
            f"the {policy.name!r} policy finds no plan within {format_bytes(budget)} ({budget} B); the planner's "
            f"own minimum is {format_bytes(least.peak_bytes)} ({least.peak_bytes} B): use policy 'auto' or a "
            f"larger budget", least.peak_bytes, budget)
    return least


# The most recompute steps per schedule step (CheckpointSqrt.rework) that planning sqrt(n)
# segments may start from: VGG-16, ResNet-50/101/152, GoogLeNet and DenseNet-121 have 1.1-3.4,
# a 1001-layer ResNet 10 (its first lowering has 3.2 million steps and takes a minute).
SQRT_REWORK = 6.0


def policy_variants(policy, cost):
    """The policy and, for the hybrid, its swap-only variant and (where copies take time from
    compute) the variant that ranks offloads as if they did not: the simulator picks the fastest."""
    if isinstance(policy, AutoPolicy) and policy.hybrid:
        more = [AutoPolicy(name=policy.name, copies_free=True)] if cost.copy_overlap < 1 else []
        return [policy, AutoPolicy(recompute=False, name=policy.name)] + more
    return [policy]


def _rechains(plan) -> bool:
    """Whether the plan's recomputations mostly recompute chains of dropped inputs again and again
    (more than three recompute steps per recomputed value; below that, searching for a horizon
    costs a deep network's planning more time than its plan gains)."""
    chosen = sum(ev.kind == "recompute" for ev in plan.evictions.values())
    return chosen > 0 and sum(s.kind == "recompute" for s in plan.program.steps) > 3 * chosen


def _keep_chains(choose, schedule, limit, cost, touch, build, best, memo=None):
    """The fastest of ``best`` and plans whose lowering keeps recomputed chain inputs for their
    next use within a horizon, doubled while that keeps getting faster: a longer horizon
    recomputes less but holds more, so at some point the policy must evict more to fit."""
    horizon = 16
    while horizon < len(schedule.steps):
        plan = _fit(choose, schedule, limit, cost, touch, build, keep_within=horizon, beat=best.simulation.seconds,
                    memo=memo)
        if plan is None or plan.simulation.seconds >= best.simulation.seconds:
            break
        best, horizon = plan, 2 * horizon
    return best


def _chooser(policy, schedule, cost, touch, options, algos):
    """The policy as a function target -> (evictions, algorithms): its resumable chooser where it
    has one, else its ``choose`` (algorithms too) or ``evictions`` (the given algorithms)."""
    if hasattr(policy, "chooser"):
        return policy.chooser(schedule, cost, touch, options, algos)
    if hasattr(policy, "choose"):
        return lambda target: policy.choose(schedule, target, cost, touch, options, algos)
    return lambda target: (policy.evictions(schedule, target, cost, touch), algos)


def _fit(choose, schedule, limit, cost, touch, build, rounds=8, beat=None, keep_within=0, memo=None):
    """The fastest plan found whose exact placement fits ``limit``, or None.

    ``choose``: target -> (evictions, algorithms). The greedy's lowered program
    (horizon 0) stays within its target (greedy.py); placement (fragmentation),
    a longer horizon, or a baseline's own rule add on top, which is known only
    afterwards. So the target is searched: lowered by at least the overshoot
    until a plan fits, then bisected between the highest target that fit and
    the lowest that did not.

    With ``beat`` (the step time of a plan found already), a search in which no
    plan has fit yet ends at an attempt predicted to take ``beat`` or longer
    (the simulation does not depend on placement, so it is not placed): a
    lower target is a longer prefix of the same greedy decisions, so it is
    rarely faster. ``memo``: lowerings by decisions, shared by one plan's searches.
    """
    memo = {} if memo is None else memo

    def attempt(target):
        ev, chosen = choose(target)
        if ev is None:
            return None, None
        key = (frozenset(ev.items()), frozenset(chosen.items()), keep_within)
        if key not in memo:                      # (a fixed rule answers every target alike)
            program = lower(schedule, ev, touch, chosen, keep_within)
            memo[key] = [program, int(memory_curve(program).max(initial=0)), None, None]
        entry = memo[key]
        program, live, sim, plan = entry
        if live > limit:                         # only a candidate that can fit is worth placing
            return None, live
        if sim is None:
            sim = entry[2] = simulate(program, schedule, cost, algos=chosen)
        if beat is not None and best is None and sim.seconds >= beat:
            return None, None                    # cannot win, nor can a lower target
        if plan is None:
            plan = entry[3] = build(ev, chosen, program, sim, keep_within)
        return (plan, None) if plan.arena_bytes <= limit else (None, plan.arena_bytes)

    step = max(limit // 64, 1)
    fit = miss = None                            # highest target that fit, lowest that did not
    best, target = None, limit
    for _ in range(rounds):
        plan, need = attempt(target)
        if plan is not None:
            fit = target
            if best is None or plan.simulation.seconds < best.simulation.seconds:
                best = plan
        elif need is None:                       # the policy cannot go this low
            if best is None:
                return None
            miss = target
        else:
            miss = target
        if best is None:
            target -= max(need - limit, step)
            if target <= 0:
                return None
        elif miss is None or miss - fit <= step:
            break
        else:
            target = (fit + miss) // 2
    return best


def minimum_plan(schedule, cost, touch, build, options):
    """Everything evictable evicted, just in time, smallest workspaces: the least this planner needs."""
    return build(Greedy(schedule, cost, touch, True, True).all(), smallest(options))


@_collector_paused
def minimum_bytes(schedule, config=None, cost=None) -> int:
    """The smallest budget ``plan_memory`` meets for ``schedule`` (what MemoryBudgetError reports)."""
    config = config or MemoryConfig()
    cost = CachedCost(cost or ProfileCost(config.profile))
    touch = touches(schedule)
    options = algorithm_options(schedule, cost) if config.algorithms == "auto" else {}
    least = minimum_plan(schedule, cost, touch,
                         lambda ev, al: make_plan(schedule, ev, None, "minimum", touch=touch, algos=al), options)
    full = make_plan(schedule, {}, None, "none", touch=touch, algos=fastest(options))
    return min(least.peak_bytes, full.peak_bytes)


def _infeasible(budget, minimum, plan):
    curve = plan.live_curve
    at = max(range(len(curve)), key=curve.__getitem__)
    raise MemoryBudgetError(
        f"budget {format_bytes(budget)} ({budget} B) is below the minimum feasible "
        f"{format_bytes(minimum)} ({minimum} B), set by step {at} ({plan.steps[at].label})", minimum, budget)
