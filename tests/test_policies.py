"""The memory policies of the papers (memory/baselines.py) and minidnn's own, side by side.

Each policy, at a budget it meets, trains bit for bit like unlimited memory
(poison mode and the overlap check on), its plan stays within the budget, and
the plan is the policy's own (not the planner's fallback). Unknown names are
refused with the list of known ones. The bitwise runs keep every op's default
algorithm (another convolution algorithm may change the last bits, eviction
may not); planning is checked with the algorithm choice on.
"""
import math

import numpy as np
import pytest

import minidnn as mdn
from minidnn import models, nn, optim
from minidnn.autograd import build_schedule
from minidnn.graph import trace
from minidnn.memory import MemoryConfig, ProfileCost, plan_memory
from minidnn.memory.baselines import (CheckpointSqrt, Layers, Recorded, just_in_time, layerwise_offloads,
                                      memory_optimal)
from minidnn.memory.planner import algorithm_options, fastest, make_plan
from minidnn.memory.policies import POLICIES, get_policy
from minidnn.memory.facts import Facts
from minidnn.memory.subbatch import SubBatchPlan
from minidnn.schedule import ACT_GRAD

NETS = {"resnet20": (8, 3, 32, 32), "densenet_small": (8, 3, 32, 32)}
# rules whose decisions do not depend on the budget: their own plan's peak is a budget they meet
# (vDNN's at the fastest algorithms and every prefetch one layer ahead; it meets less: least_peak)
FIXED = ("vdnn_all", "vdnn_conv", "checkpoint_sqrt", "superneurons")


def optimizer():
    return optim.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4)


def schedule_of(name):
    g = trace(models.get(name), NETS[name], loss=nn.CrossEntropyLoss())
    return build_schedule(g, optimizer=optimizer())


def own_peak(name, policy, algorithms="auto"):
    sched = schedule_of(name)
    facts, cost = Facts(sched), ProfileCost("cpu-2core")
    algos = fastest(algorithm_options(sched, cost)) if algorithms == "auto" else {}  # as plan_memory starts
    ev = get_policy(policy).evictions(facts, math.inf, cost, algos)
    return make_plan(sched, ev, cost, policy, facts=facts, algos=algos).peak_bytes


def budget_for(name, policy, algorithms="auto"):
    """A budget below the liveness peak that the policy meets: its own peak for the fixed rules,
    vDNN_all's peak (the smallest of the layer-wise ones) for the budget-driven planners but the
    recompute-only one (vDNN_conv's)."""
    if policy == "none":
        return plan_memory(schedule_of(name), MemoryConfig(algorithms=algorithms)).peak_bytes
    return own_peak(name, policy if policy in FIXED else "vdnn_conv" if policy == "recompute" else "vdnn_all",
                    algorithms)


def run(name, memory):
    rng = np.random.default_rng(1)
    shape = NETS[name]
    net = models.get(name).init_parameters(0)
    trainer = mdn.compile(net, shape, nn.CrossEntropyLoss(), optimizer(), memory=memory, trace_every=0)
    losses = [trainer.step(rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0]))
              for _ in range(3)]
    return trainer, losses, {k: np.array(v) for k, v in net.state_dict().items()}


@pytest.fixture(scope="module")
def unlimited():
    return {name: run(name, MemoryConfig(algorithms="default")) for name in NETS}


@pytest.mark.parametrize("name", list(NETS))
@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_policy_trains_bitwise_like_unlimited_memory(unlimited, name, policy):
    budget = budget_for(name, policy, "default")
    trainer, losses, state = run(name, MemoryConfig(budget=budget, policy=policy, algorithms="default",
                                                    sub_batching=False, poison=True, check=True))
    _, ref_losses, ref_state = unlimited[name]
    plan = trainer.plan
    assert not isinstance(plan, SubBatchPlan)
    assert plan.peak_bytes <= budget and trainer.measured_peak_bytes == plan.peak_bytes
    if policy != "none":
        assert plan.evictions, f"{policy} at {budget} B should evict something"
    if policy not in ("auto", "none"):         # the policy's own plan, not the planner's fallback
        rec = Recorded(get_policy(policy))
        plan_memory(schedule_of(name), MemoryConfig(budget=budget, policy=rec, algorithms="default"))
        assert rec.owns(plan)
    assert losses == ref_losses
    for k in ref_state:
        assert np.array_equal(state[k], ref_state[k]), k


@pytest.mark.parametrize("name", list(NETS))
@pytest.mark.parametrize("policy", [p for p in POLICIES if p not in ("auto", "none")])
def test_the_plan_is_the_policys_own(name, policy):
    sched = schedule_of(name)
    rec = Recorded(get_policy(policy))
    budget = budget_for(name, policy)
    plan = plan_memory(sched, MemoryConfig(budget=budget, policy=rec))
    assert rec.owns(plan), "plan_memory fell back to the minimum plan"
    assert plan.peak_bytes <= budget
    if policy not in ("swap", "recompute"):    # none of the papers evicts gradients
        assert all(sched.tensors[t].category != ACT_GRAD for t, _ in plan.evictions)


def least_peak(name, policy):
    """vDNN's least need: its offloads with every prefetch just in time and the memory-optimal
    algorithms (below it the rule has no plan)."""
    sched = schedule_of(name)
    facts, cost = Facts(sched), ProfileCost("cpu-2core")
    options = algorithm_options(sched, cost)
    algos = memory_optimal(options, fastest(options))
    ev = just_in_time(layerwise_offloads(facts, convs_only=policy == "vdnn_conv"))
    return make_plan(sched, ev, cost, policy, facts=facts, algos=algos).peak_bytes


@pytest.mark.parametrize("policy", ("vdnn_all", "vdnn_conv", "checkpoint_sqrt"))  # (superneurons trades workspace)
def test_rules_refuse_a_budget_below_their_least(policy):
    sched = schedule_of("resnet20")
    least = own_peak("resnet20", policy) if policy == "checkpoint_sqrt" else least_peak("resnet20", policy)
    budget = least - 4096
    rec = Recorded(get_policy(policy))
    with pytest.raises(mdn.MemoryBudgetError) as e:
        plan_memory(sched, MemoryConfig(budget=budget, policy=rec))
    assert e.value.budget_bytes == budget
    assert f"the {policy!r} policy finds no plan" in str(e.value)   # the rule's refusal, not infeasibility
    assert e.value.minimum_bytes < budget                            # auto would meet it
    if policy != "checkpoint_sqrt":                                  # vDNN: nothing it returned fits
        assert not rec.returned
        rec = Recorded(get_policy(policy))
        plan = plan_memory(sched, MemoryConfig(budget=least, policy=rec))   # and its least it meets
        assert rec.owns(plan) and plan.peak_bytes <= least


@pytest.mark.parametrize("name", list(NETS))
def test_auto_is_at_or_below_every_policy(name):
    """auto plans every policy as a seed, so its plan is predicted no slower than any policy's own."""
    sched = schedule_of(name)
    for policy in ("vdnn_all", "vdnn_conv", "vdnn_dyn", "superneurons", "modnn", "swap", "recompute"):
        budget = budget_for(name, policy)
        own = plan_memory(sched, MemoryConfig(budget=budget, policy=policy))
        auto = plan_memory(sched, MemoryConfig(budget=budget))
        assert auto.peak_bytes <= budget
        assert auto.simulation.seconds <= own.simulation.seconds, policy


def test_layerwise_rules():
    sched = schedule_of("resnet20")
    facts = Facts(sched)
    touch = facts.touch
    conv = layerwise_offloads(facts, convs_only=True)
    every = layerwise_offloads(facts)
    assert set(conv) < set(every)
    end = max(s.index for s in sched.steps if s.kind == "forward")
    layer = Layers(facts).layer       # backward step -> its layer (a step and its in-place activations)
    for (t, g), ev in every.items():
        a, b = touch[t][g], touch[t][g + 1]
        assert ev.kind == "offload" and a <= end < b            # forward -> backward only
        assert ev.early and ev.delay == 0                       # copied while its last reader runs, freed after it
        # prefetched as the backward of the layer after b's starts: the steps from there to b are
        # that layer's and b's own, and the step before is neither
        between = {layer[i] for i in range(b - ev.lead, b + 1) if i in layer}
        assert len(between - {layer.get(b)}) == 1 and layer.get(b - ev.lead - 1) not in between
    for s in sched.steps:
        if s.kind == "forward" and s.node.op.name == "conv2d" and s.ins[0] in touch and touch[s.ins[0]][-1] > end:
            assert any(t == s.ins[0] for t, _ in conv)


def test_checkpoint_segments_are_about_sqrt_n():
    sched = schedule_of("resnet20")
    facts = Facts(sched)
    n = sum(s.kind == "forward" for s in sched.steps)
    cuts, _ = CheckpointSqrt.cuts(facts)
    assert abs(len(cuts) + 1 - math.sqrt(n)) <= 2
    assert all(ev.kind == "recompute" for ev in CheckpointSqrt().decisions(facts).values())


def test_unknown_policy_lists_the_known_ones():
    with pytest.raises(ValueError) as e:
        plan_memory(schedule_of("resnet20"), MemoryConfig(budget=0.5, policy="vdnn_everything"))
    for name in POLICIES:
        assert name in str(e.value)
    for name in POLICIES:
        assert get_policy(name).name == name or name in ("swap", "recompute")
