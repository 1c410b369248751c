"""The exact reference (memory/optimal.py): its MILP finds the model's optimum, and its plan executes.

The MILP's optimum on a small chain equals a brute-force enumeration of every keep/recompute
decision (and every algorithm) evaluated directly in the same model; its plan, lowered, placed
and simulated by the planner's code, fits the budget, the executor measures the plan's peak,
and three SGD steps under it (poison mode and the overlap check on) equal the unlimited run bit
for bit. A budget below the lower bound is refused.
"""
import itertools

import numpy as np
import pytest

import minidnn as mdn
from minidnn import nn, optim
from minidnn.autograd import build_schedule
from minidnn.graph import trace
from minidnn.memory import MemoryConfig, ProfileCost, lower_bound, minimum_bytes, plan_memory
from minidnn.memory.costmodel import CachedCost
from minidnn.memory.optimal import OptimalPolicy, solve, solve_reference
from minidnn.memory.optimal_model import Model
from minidnn.memory.planner import algorithm_options, smallest
from minidnn.memory.program import lower
from minidnn.memory.simulator import memory_curve, simulate

from networks import make_resnet

CHAIN = (4, 3, 8, 8)


def chain():
    """(conv -> relu) x 3 -> conv -> flatten -> linear."""
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1), nn.Flatten(),
                         nn.Linear(4 * 8 * 8, 10))


def mlp():
    """(linear -> relu) x 4 -> linear: no workspace, every activation a candidate."""
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(32, 32), nn.ReLU())], nn.Linear(32, 10))


def optimizer():
    return optim.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4)


def schedule_of(net, shape):
    return build_schedule(trace(net, shape, loss=nn.CrossEntropyLoss()), optimizer=optimizer())


@pytest.mark.parametrize("algorithms", ["default", "auto"])
def test_the_milp_optimum_equals_brute_force_over_the_model(algorithms):
    """Keep/recompute alone (an MLP), and with the algorithm one-hot (a conv chain)."""
    sched = schedule_of(*((mlp(), (64, 32)) if algorithms == "default" else (chain(), CHAIN)))
    cost = CachedCost(ProfileCost("v100-16gb"))
    # each step's fastest and smallest-workspace algorithms: few enough to enumerate
    options = {s: [opts[0], min(opts, key=lambda p: p[1].workspace)]
               for s, opts in algorithm_options(sched, cost).items()} if algorithms == "auto" else {}
    model = Model(sched, cost, options=options, offload=False)
    gaps = list(model.d)
    steps = sorted(options)
    assert len(gaps) >= 4 and (algorithms == "default" or steps)
    choices = [[(s, a) for _, a in options[s]] for s in steps]
    results = []
    for drops in itertools.product((False, True), repeat=len(gaps)):
        ev = {g: mdn.memory.program.Evict("recompute") for g, on in zip(gaps, drops) if on}
        for algos in itertools.product(*choices) if choices else [()]:
            seen = model.evaluate(ev, dict(algos))
            if seen is not None:
                results.append(seen[:2])
    peaks = sorted({p for _, p in results})
    assert len(peaks) > 2
    for limit in peaks[len(peaks) // 3], peaks[len(peaks) // 2]:    # budgets that bind
        best = min(s for s, p in results if p <= limit)
        sol = solve(model, limit, time_limit=30)
        assert sol.status == "Optimal"
        assert sol.objective == pytest.approx(best, rel=1e-6)
        seconds, peak, *_ = model.evaluate(sol.evictions, sol.algos)
        assert peak <= limit and seconds == pytest.approx(best, rel=1e-6)
        assert best > min(s for s, _ in results)                      # the limit costs time


def test_the_optimal_plan_fits_and_beats_or_equals_the_heuristic():
    sched = schedule_of(make_resnet(nn), (8, 3, 16, 16))
    liveness = plan_memory(sched).peak_bytes
    budget = int(0.6 * liveness)
    ref = solve_reference(sched, budget, time_limit=2)
    assert ref.milp is not None and ref.milp.peak_bytes <= budget and ref.milp.evictions
    assert ref.plan.simulation.seconds <= ref.heuristic.simulation.seconds
    assert ref.plan.simulation.seconds == min(ref.milp.simulation.seconds, ref.heuristic.simulation.seconds)


def batches(shape, n=3):
    rng = np.random.default_rng(1)
    return [(rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0])) for _ in range(n)]


def run(memory, shape=(8, 3, 16, 16)):
    net = make_resnet(nn).init_parameters(0)
    trainer = mdn.compile(net, shape, nn.CrossEntropyLoss(), optimizer(), memory=memory, trace_every=0)
    losses = [trainer.step(x, y) for x, y in batches(shape)]
    return trainer, losses, {k: np.array(v) for k, v in net.state_dict().items()}


@pytest.mark.parametrize("fraction", [0.7, 0.3])
def test_training_with_the_optimal_plan_is_bitwise_identical(fraction):
    """At budgets between the planner's minimum and the liveness peak, every op's default algorithm."""
    sched = schedule_of(make_resnet(nn), (8, 3, 16, 16))
    least = minimum_bytes(sched, MemoryConfig(algorithms="default"))
    peak = plan_memory(sched, MemoryConfig(algorithms="default")).peak_bytes
    budget = int(least + fraction * (peak - least))
    _, ref_losses, ref_state = run(MemoryConfig(algorithms="default"))
    trainer, losses, state = run(MemoryConfig(budget=budget, policy=OptimalPolicy(time_limit=20),
                                              algorithms="default", poison=True, check=True, sub_batching=False))
    plan = trainer.plan
    assert plan.policy == "optimal" and plan.evictions
    assert plan.peak_bytes <= plan.budget and trainer.measured_peak_bytes == plan.peak_bytes
    assert losses == ref_losses
    for k in ref_state:
        assert np.array_equal(state[k], ref_state[k]), k


def test_a_budget_below_the_lower_bound_is_refused():
    sched = schedule_of(chain(), CHAIN)
    cost = CachedCost(ProfileCost("cpu-2core"))
    least = lower_bound(sched, smallest(algorithm_options(sched, cost)))
    with pytest.raises(mdn.MemoryBudgetError) as e:
        solve_reference(sched, least - 64, cost)
    assert e.value.minimum_bytes == least


def stages(program):
    """The schedule step each program step belongs to: its own, or (a restore) the step it precedes."""
    out, pending = [], 0
    for s, origin in zip(program.steps, program.origin):
        if s.kind == "recompute":
            pending += 1
            continue
        out += [origin] * (pending + 1)
        pending = 0
    return np.array(out)


@pytest.mark.parametrize("net, shape, exact", [(chain, CHAIN, True), (lambda: make_resnet(nn), (8, 3, 16, 16), False)])
def test_the_model_matches_the_lowering(net, shape, exact):
    """On random keep/recompute decisions, the model's time is the simulator's and its memory at each
    stage is at least the lowered program's there (equal on a chain)."""
    sched = schedule_of(net(), shape)
    cost = CachedCost(ProfileCost("v100-16gb"))
    options = algorithm_options(sched, cost)
    model = Model(sched, cost, options=options, offload=False)
    rng = np.random.default_rng(0)
    algos = {s: opts[int(rng.integers(len(opts)))][1] for s, opts in options.items()}
    checked = 0
    for _ in range(20):
        ev = {g: mdn.memory.program.Evict("recompute") for g in model.d if rng.random() < 0.3}
        seen = model.evaluate(ev, algos)
        if seen is None:
            continue
        checked += 1
        program = lower(sched, ev, model.touch, algos)
        assert seen.seconds == pytest.approx(simulate(program, sched, cost, algos=algos).seconds, rel=1e-9)
        per_stage = np.zeros(len(sched.steps), np.int64)
        np.maximum.at(per_stage, stages(program), memory_curve(program))
        modelled = [max([model.step_memory(s).value(seen.x)] + [model.rerun_memory(s, p, model.before_chain(s))
                                                              .value(seen.x) for p in model.reruns[s]])
                    for s in range(model.n)]
        assert np.all(np.array(modelled) >= per_stage)
        if exact:
            assert np.array_equal(np.array(modelled), per_stage)
    assert checked >= 10
