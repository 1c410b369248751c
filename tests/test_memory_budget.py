"""Training under a memory budget is bitwise identical to training with unlimited memory.

For each network and budget (fractions of the liveness peak, and the smallest
budget the planner can meet), three SGD steps run with poison mode and the
overlap check on; losses and parameters must equal the unlimited run's bit for
bit, the executor's measured peak must equal the plan's, and both must be
within the budget.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minidnn as mdn
from minidnn import models, nn, optim
from harness import host
from minidnn.autograd import build_schedule
from minidnn.backend import get_backend
from minidnn.graph import trace
from minidnn.memory import MemoryConfig, minimum_bytes, plan_memory

NETS = {
    # ResNet-18's CIFAR topology at a quarter of the width, so that activations, not the
    # 11M parameters, dominate memory at a test-sized batch
    "resnet18_cifar": (lambda: models.get("resnet18_cifar", widths=(16, 32, 64, 128)), (32, 3, 32, 32)),
    "densenet_small": (lambda: models.get("densenet_small"), (16, 3, 32, 32)),
}


def batches(shape, n=3):
    rng = np.random.default_rng(1)
    return [(rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0])) for _ in range(n)]


def run(name, budget, algorithms="auto", dtype=np.float32, device="cpu"):
    build, shape = NETS[name]
    net = build().init_parameters(0)
    trainer = mdn.compile(net, shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4),
                          memory=MemoryConfig(budget=budget, poison=True, check=True, algorithms=algorithms,
                                              sub_batching=False), dtype=dtype, device=device)
    losses = [trainer.step(x, y) for x, y in batches(shape)]
    return trainer, losses, {k: host(v) for k, v in net.state_dict().items()}


@pytest.fixture(scope="module")
def unlimited():
    """The unlimited-memory runs, by (network, algorithm setting, device), made when first asked for."""
    runs = {}

    def get(name, algorithms, device):
        if (name, algorithms, device) not in runs:
            runs[name, algorithms, device] = run(name, None, algorithms, device=device)
        return runs[name, algorithms, device]
    return get


def schedule_of(name):
    build, shape = NETS[name]
    g = trace(build(), shape, loss=nn.CrossEntropyLoss())
    return build_schedule(g, optimizer=optim.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4))


@pytest.mark.parametrize("name", list(NETS))
@pytest.mark.parametrize("budget, algorithms", [(1.0, "auto"), (0.6, "auto"), (0.4, "auto"), ("minimum", "auto"),
                                                (0.8, "default"), ("minimum", "default")])
def test_budgeted_training_is_bitwise_identical(unlimited, name, budget, algorithms, device):
    """Offload, prefetch and recompute never change a bit. Where the planner also gave a step a
    smaller-workspace algorithm (listed in plan.algorithm_changes) the rounding may differ;
    with algorithms="default" nothing but eviction is used, down to that setting's minimum."""
    if budget == "minimum":     # with the device's algorithms (cuDNN's on cuda)
        cost = get_backend(device).planning_cost(None, MemoryConfig().profile)
        budget = minimum_bytes(schedule_of(name), MemoryConfig(algorithms=algorithms), cost)
    trainer, losses, state = run(name, budget, algorithms, device=device)
    _, ref_losses, ref_state = unlimited(name, algorithms, device)
    plan = trainer.plan
    if plan.algorithm_changes:      # float32 rounding, amplified by 3 steps of BN + momentum
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-3)
    else:
        assert losses == ref_losses
        for k in ref_state:
            assert np.array_equal(state[k], ref_state[k]), k
    assert trainer.measured_peak_bytes == plan.peak_bytes <= plan.budget
    if algorithms == "default":
        assert not plan.algorithm_changes
    if budget != 1.0:
        assert plan.evictions, "a tight budget should evict something"


def test_other_algorithms_compute_the_same_function_in_float64():
    """Where a budget changes convolution algorithms, float64 shows the results are the same maths."""
    _, ref_losses, ref_state = run("resnet18_cifar", None, dtype=np.float64)
    trainer, losses, state = run("resnet18_cifar", 0.4, dtype=np.float64)
    assert trainer.plan.algorithm_changes
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)
    for k in ref_state:
        np.testing.assert_allclose(state[k], ref_state[k], rtol=1e-8, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("name", list(NETS))
def test_below_the_minimum_is_refused_with_the_minimum(name):
    sched = schedule_of(name)
    m = minimum_bytes(sched)
    assert plan_memory(sched, MemoryConfig(budget=m)).peak_bytes <= m   # the minimum is feasible
    with pytest.raises(mdn.MemoryBudgetError) as e:
        plan_memory(sched, MemoryConfig(budget=m - 1))
    assert e.value.minimum_bytes == m
    assert f"({m} B)" in str(e.value)


def test_partial_batch_and_predict_get_the_same_bytes_as_a_fractional_budget():
    build, shape = NETS["densenet_small"]
    trainer = mdn.compile(build().init_parameters(0), shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.05),
                          memory=MemoryConfig(budget=0.7))
    budget = trainer.plan.budget
    x, y = batches((5,) + shape[1:], 1)[0]
    trainer.step(x, y)
    trainer.predict(x)
    for plan in trainer._plans.values():
        assert plan.budget == budget and plan.peak_bytes <= budget


@settings(max_examples=12, deadline=None)
@given(frac=st.floats(0.0, 1.0))
def test_any_budget_between_the_minimum_and_the_peak_is_met_exactly(frac):
    sched = schedule_of("densenet_small")
    lo = minimum_bytes(sched)
    hi = plan_memory(sched).peak_bytes
    budget = int(lo + frac * (hi - lo))
    plan = plan_memory(sched, MemoryConfig(budget=budget))
    assert plan.peak_bytes <= budget
    assert max(plan.simulation.memory) + plan.persistent_bytes <= budget
