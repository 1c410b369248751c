"""The exact reference (memory/optimal.py) against its own reference: every decision enumerated.

On random DAGs small enough to enumerate, every combination of the reference's decisions (each
gap kept, recomputed, or offloaded at each timing the model offers it; each step's algorithm
among its Pareto ones) is lowered, placed and simulated by ``planner.make_plan``, as the
reference judges its candidates; a plan fits where its placed arena is within the limit. At three
budgets per DAG where the limit binds, the reference's plan is the fastest that fits (or the
heuristic's, which it keeps as a candidate too), it says so ("optimal"), and its proven bound is
not above it.
"""
import itertools
import time

import numpy as np
import pytest

from minidnn import nn, optim
from minidnn.autograd import build_schedule
from minidnn.errors import MemoryBudgetError
from minidnn.graph import trace
from minidnn.memory import MemoryConfig, plan_memory
from minidnn.memory.costmodel import CachedCost, ProfileCost
from minidnn.memory.optimal import TOLERANCE, pareto, solve_reference
from minidnn.memory.optimal_model import PAIRED_TIMINGS, RECOMPUTE, Model
from minidnn.memory.planner import algorithm_options, fastest, make_plan
from minidnn.memory.facts import Facts
from minidnn.models.random_dag import SHAPE, RandomDag, random_spec

PROFILE = "v100-16gb"
# (seed, nodes) of models/random_dag.random_spec: DAGs whose decisions number a few hundred to about a
# thousand, with convolutions (algorithm choices), BatchNorm (chains with fused passes and several
# outputs), joins and pools between them
DAGS = [(1, 3), (3, 5), (8, 4), (11, 2), (23, 2), (30, 2), (33, 3), (35, 2)]
# the limits tried, as fractions of the way from the least arena any decision needs to the least of
# the fastest plans': where every limit binds, and the placement decides which plans fit
FRACTIONS = (0.2, 0.5, 0.8)


def schedule_of(seed, nodes):
    spec = random_spec(np.random.default_rng(seed), nodes)
    graph = trace(RandomDag(spec), SHAPE, loss=nn.CrossEntropyLoss())
    return build_schedule(graph, optimizer=optim.SGD(lr=0.05, momentum=0.9))


def decision_space(model, options):
    """(gaps and steps, the choices of each): each gap kept (None), recomputed, or offloaded at each
    timing the model offers it; each step's algorithms."""
    keys, choices = [], []
    for t, g, _, _ in model.gaps:
        keys.append((t, g))
        choices.append([None] + ([RECOMPUTE] if (t, g) in model.d else [])
                       + sorted(model.pairs.get((t, g), ()), key=lambda ev: (ev.delay, ev.lead, ev.early)))
    for s, opts in sorted(options.items()):
        keys.append(s)
        choices.append([algo for _, algo in opts])
    return keys, choices


def enumerate_plans(sched, cost, options, model):
    """(arena bytes, simulated seconds) of every decision of the space that the lowering can run,
    each made by make_plan and placed packed where the default placement fragments, as the
    reference places its candidates where they are over the budget (the same plans fit)."""
    facts = Facts(sched)
    keys, choices = decision_space(model, options)
    quick = fastest(options)
    out = []
    for combo in itertools.product(*choices):
        evictions = {k: c for k, c in zip(keys, combo) if isinstance(k, tuple) and c is not None}
        algos = {k: c for k, c in zip(keys, combo) if not isinstance(k, tuple)}
        try:
            plan = make_plan(sched, evictions, cost, "exhaustive", facts=facts, algos={**quick, **algos}, pack=True)
        except ValueError:                   # a chain would need a value neither on the host nor recomputable
            continue
        out.append((plan.arena_bytes, plan.simulation.seconds))
    return np.array(out)


@pytest.mark.parametrize("seed, nodes", DAGS)
def test_the_reference_is_the_fastest_plan_that_places(seed, nodes):
    sched = schedule_of(seed, nodes)
    cost = CachedCost(ProfileCost(PROFILE))
    options = pareto(algorithm_options(sched, cost))
    model = Model(Facts(sched), cost, options, True, {}, PAIRED_TIMINGS)
    began = time.perf_counter()
    plans = enumerate_plans(sched, cost, options, model)
    assert len(plans) >= 8 and time.perf_counter() - began < 60
    arenas, seconds = plans[:, 0].astype(np.int64), plans[:, 1]
    least = arenas.min()
    fast = arenas[seconds <= seconds.min() * (1 + TOLERANCE)].min()   # the least arena of a fastest plan
    assert fast > least
    limits = sorted({int(least + f * (fast - 1 - least)) for f in FRACTIONS})
    for limit in limits:
        budget = sched.persistent_bytes + limit
        try:
            heuristic = plan_memory(sched, MemoryConfig(budget=budget, profile=PROFILE), cost)
        except MemoryBudgetError:
            heuristic = None
        found = list(seconds[arenas <= limit])
        if heuristic is not None and heuristic.peak_bytes <= budget:
            found.append(heuristic.simulation.seconds)
        expected = min(found, default=np.inf)
        ref = solve_reference(sched, budget, cost, MemoryConfig(profile=PROFILE), time_limit=60,
                              heuristic=heuristic, hinted=False)
        assert ref.optimal, (limit, ref.status)
        if np.isinf(expected):
            assert ref.plan is None
            continue
        assert ref.plan.peak_bytes <= budget
        assert ref.plan.simulation.seconds == pytest.approx(expected, rel=TOLERANCE)
        assert ref.bound <= expected * (1 + TOLERANCE)
        assert expected > seconds.min() * (1 + TOLERANCE)     # the limit costs time: the search had work
