"""Sub-batching: a mini-batch that cannot fit at its full size is split, and still trains the same.

Without BatchNorm, k sub-batches accumulating 1/k-scaled gradients followed by
one update give the unsplit run's parameters up to float rounding. With
BatchNorm the default (``MemoryConfig(bn="exact")``) uses the full mini-batch's
statistics, and a ResNet-18 gives the unsplit run's parameters, running
statistics and counters too; moDNN's per-sub-batch statistics are an opt-in
(``bn="sub-batch"``).
"""
import numpy as np
import pytest

import minidnn as mdn
from harness import host
from minidnn import models, nn, optim
from minidnn.memory import MemoryConfig
from minidnn.graph import trace
from minidnn.memory.subbatch import StagedPlan, SubBatchPlan
from minidnn.split_graph import split_graph

NETS = {
    "lenet5": (lambda: models.get("lenet5"), (16, 1, 28, 28)),
    "vgg11": (lambda: models.get("vgg11", num_classes=10, image_size=64, dropout=0.0), (8, 3, 64, 64)),
    # CIFAR ResNet-18's topology (20 BatchNorms, projection shortcuts), narrowed to keep 2 cores quick
    "resnet18": (lambda: models.resnet18_cifar(num_classes=10, widths=(4, 8, 16, 32)), (8, 3, 16, 16)),
    # activations dominate (no large classifier): evicting them is what a budget costs
    "convnet": (lambda: nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                      nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)), (16, 3, 32, 32)),
}


def full_batch_minimum(name, dtype=np.float32, device="cpu"):
    build, shape = NETS[name]
    with pytest.raises(mdn.MemoryBudgetError) as e:
        mdn.compile(build(), shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.01, momentum=0.9), dtype=dtype,
                    memory=MemoryConfig(budget=4096, sub_batching=False), device=device)
    return e.value.minimum_bytes


def split_budget(name, dtype=np.float32, device="cpu"):
    """A budget below the full batch's minimum but above the minimum at sub-batch 1."""
    full = full_batch_minimum(name, dtype, device)
    build, shape = NETS[name]
    with pytest.raises(mdn.MemoryBudgetError) as e:     # far too small: the error states the sub-batch minimum
        mdn.compile(build(), shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.01, momentum=0.9), memory=4096,
                    dtype=dtype, device=device)
    assert e.value.minimum_bytes < full
    return (full + e.value.minimum_bytes) // 2


def run(name, budget, steps=3, dtype=np.float32, device="cpu", bn="exact", sub_batching=True):
    build, shape = NETS[name]
    net = build().init_parameters(0)
    trainer = mdn.compile(net, shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.01, momentum=0.9),
                          memory=MemoryConfig(budget=budget, poison=True, check=True, bn=bn,
                                              sub_batching=sub_batching), dtype=dtype, device=device)
    rng = np.random.default_rng(3)
    losses = [trainer.step(rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0]))
              for _ in range(steps)]
    return trainer, losses, [host(p.data).copy() for p in net.parameters()]


def summation_rtol(name, dtype, steps=3):
    """How far a split run may move the parameters, relative to their norm: a split sums each
    gradient in another order, and a sum of n terms in another order moves by about sqrt(n) units
    of rounding (the probabilistic bound of Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019, its
    constant taken as 2: eps = 2u), once per step. n is the network's longest reduction: the most
    elements one channel of a value holds (N*H*W: a weight gradient's or a BatchNorm statistic's
    sum over the batch) or one weight's fan-in. It is a property of the network and the dtype, not
    of the BLAS kernel that runs it (OpenBLAS picks another one on each CPU)."""
    build, shape = NETS[name]
    graph = trace(build(), shape, loss=nn.CrossEntropyLoss())
    longest = max(max(int(np.prod(v.spec.shape)) // v.spec.shape[1] for v in graph.values if len(v.spec.shape) >= 2),
                  max(p.data.size // p.data.shape[0] for p in build().parameters() if p.data.ndim >= 2))
    return steps * np.sqrt(longest) * np.finfo(dtype).eps


@pytest.mark.parametrize("name, dtype", [("lenet5", np.float32), ("vgg11", np.float32), ("vgg11", np.float64)])
def test_sub_batches_train_like_the_full_batch(name, dtype, device):
    """The split step equals the unsplit one up to the summation order of its reductions: within
    ``summation_rtol`` (VGG-11 at 64x64, batch 8: n = 32768, 6.5e-5 in float32, 1.2e-13 in float64)."""
    rtol = summation_rtol(name, dtype)
    _, ref_losses, ref = run(name, None, dtype=dtype, device=device)
    budget = split_budget(name, dtype, device)
    trainer, losses, got = run(name, budget, dtype=dtype, device=device)
    plan = trainer.plan
    assert isinstance(plan, SubBatchPlan) and plan.k >= 2
    assert trainer.measured_peak_bytes == plan.peak_bytes <= budget
    np.testing.assert_allclose(losses, ref_losses, rtol=rtol)
    diff = np.sqrt(sum(np.sum((a.astype(np.float64) - b) ** 2) for a, b in zip(got, ref)))
    norm = np.sqrt(sum(np.sum(b.astype(np.float64) ** 2) for b in ref))
    assert diff <= rtol * norm                       # over all parameters (zero-initialized biases stay tiny)
    assert f"{plan.k} sub-batches of {plan.sub_batch}" in plan.summary()


def test_too_small_even_for_one_sample_names_the_minimum_at_sub_batch_one():
    with pytest.raises(mdn.MemoryBudgetError) as e:
        run("lenet5", 4096, steps=0)
    assert "sub-batches of 1 sample" in str(e.value)
    assert e.value.minimum_bytes > 4096


def test_sub_batching_can_be_turned_off():
    budget = split_budget("lenet5")
    build, shape = NETS["lenet5"]
    with pytest.raises(mdn.MemoryBudgetError):
        mdn.compile(build(), shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.01),
                    memory=MemoryConfig(budget=budget, sub_batching=False))


def test_the_default_splits_a_step_that_fits_only_where_the_split_is_predicted_faster():
    """Just above its full batch's lower bound (and at most 40% of its liveness peak) a conv net fits
    by evicting a lot; the default (sub_batching="fastest") splits it because the simulator predicts
    the split faster, and it still trains like the unsplit run. sub_batching=True never splits a
    step that fits; a BatchNorm network whose split would change its statistics (bn="sub-batch") is
    not split."""
    assert MemoryConfig().sub_batching == "fastest"
    unlimited, ref_losses, ref = run("convnet", None)
    budget = max(unlimited.plan.liveness_peak_bytes * 2 // 5, unlimited.plan.lower_bound_bytes * 11 // 10)
    evicting, _, _ = run("convnet", budget, steps=0, sub_batching=True)
    assert not isinstance(evicting.plan, SubBatchPlan) and evicting.plan.predicted_overhead > 0
    trainer, losses, got = run("convnet", budget, sub_batching=MemoryConfig().sub_batching)
    plan = trainer.plan
    assert isinstance(plan, SubBatchPlan) and plan.predicted_seconds < evicting.plan.predicted_seconds
    assert trainer.measured_peak_bytes == plan.peak_bytes <= budget
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    bn_live = run("resnet18", None, steps=0)[0].plan.liveness_peak_bytes
    bn_net, _, _ = run("resnet18", bn_live * 3 // 5, steps=0, sub_batching="fastest", bn="sub-batch")
    assert not isinstance(bn_net.plan, (SubBatchPlan, StagedPlan)) and bn_net.plan.predicted_overhead > 0
    with pytest.raises(ValueError, match="sub_batching"):
        MemoryConfig(sub_batching="sometimes")


def state(net):
    return {k: np.array(v, np.float64) for k, v in net.state_dict().items()}


def relative_errors(got, ref):
    """Per state_dict entry: |got - ref| / |ref| (2-norms; entries that are zero compare absolutely)."""
    return {k: np.linalg.norm(got[k] - ref[k]) / (np.linalg.norm(ref[k]) or 1.0) for k in ref}


@pytest.fixture(scope="module")
def resnet18_runs():
    """ResNet-18 (float64) for 3 SGD-momentum steps: unsplit, and split under one budget with each BN mode."""
    _, ref_losses, _ = ref = run("resnet18", None, dtype=np.float64)
    budget = split_budget("resnet18", np.float64)
    runs = {bn: run("resnet18", budget, dtype=np.float64, bn=bn) for bn in ("exact", "sub-batch")}
    return ref, runs, budget


def test_exact_batch_norm_trains_resnet18_like_the_full_batch(resnet18_runs):
    """Every parameter, running mean and running variance within 1e-5 relative of the unsplit run
    after 3 steps; in float64 the differences are rounding (~1e-14): the semantics are exact."""
    (ref_trainer, ref_losses, _), runs, budget = resnet18_runs
    trainer, losses, _ = runs["exact"]
    plan = trainer.plan
    assert isinstance(plan, StagedPlan) and plan.k >= 2
    assert trainer.measured_peak_bytes == plan.peak_bytes <= budget
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)
    errors = relative_errors(state(trainer.net), state(ref_trainer.net))
    assert any(k.endswith("running_var") for k in errors) and any(k.endswith("bias") for k in errors)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-10, (worst, errors[worst])
    assert "BatchNorm statistics of the full mini-batch (exact)" in plan.summary()
    assert f"{plan.k} sub-batches of {plan.sub_batch}" in plan.summary()


def test_batch_norm_per_sub_batch_does_differ(resnet18_runs):
    """The opt-in moDNN semantics normalize each sub-batch alone: far from the unsplit run, so the
    exact mode's agreement above is not a test that cannot fail. The summary names the opt-in, and
    each sub-batch's forward moves the running statistics and the counters."""
    (ref_trainer, ref_losses, _), runs, budget = resnet18_runs
    trainer, losses, _ = runs["sub-batch"]
    assert isinstance(trainer.plan, SubBatchPlan) and trainer.plan.k >= 2
    assert trainer.measured_peak_bytes == trainer.plan.peak_bytes <= budget
    assert "BatchNorm statistics per sub-batch (moDNN's; bn='sub-batch')" in trainer.plan.summary()
    assert all(int(v) == 3 * trainer.plan.k for k, v in state(trainer.net).items() if k.endswith("num_batches_tracked"))
    errors = relative_errors(state(trainer.net), state(ref_trainer.net))
    assert max(errors.values()) > 1e-2
    assert not np.allclose(losses, ref_losses, rtol=1e-6)


def test_the_default_split_keeps_batch_norm_exact_in_float32():
    """A split keeps the step's meaning by default: full-batch BatchNorm statistics, and counters that
    count steps (3 after 3 steps). float32 meets 1e-5 too: the split forms each gradient in the
    unsplit kernel's order (the input gradient from gy in one expression, gamma's and beta's from
    full-batch float64 sums). The worst entries are BatchNorm biases, whose gradient sum(gy) cancels:
    here the unsplit float32 run itself is ~1.5e-6 from the float64 one, and the split ~1.7e-6 from
    the unsplit float32 run."""
    ref_trainer, ref_losses, _ = run("resnet18", None)
    budget = split_budget("resnet18")
    build, shape = NETS["resnet18"]
    net = build().init_parameters(0)
    trainer = mdn.compile(net, shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.01, momentum=0.9), memory=budget)
    rng = np.random.default_rng(3)
    losses = [trainer.step(rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0]))
              for _ in range(3)]
    assert isinstance(trainer.plan, StagedPlan) and trainer.plan.k >= 2
    assert "BatchNorm statistics of the full mini-batch (exact)" in trainer.plan.summary()
    counters = {k: int(v) for k, v in state(net).items() if k.endswith("num_batches_tracked")}
    assert counters and set(counters.values()) == {3}
    assert trainer.measured_peak_bytes == trainer.plan.peak_bytes <= budget
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    errors = relative_errors(state(trainer.net), state(ref_trainer.net))
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-5, (worst, errors[worst])


def test_bn_mode_is_checked():
    with pytest.raises(ValueError, match="'exact' or 'sub-batch'"):
        MemoryConfig(bn="full")


def test_exact_batch_norm_refuses_a_graph_that_mixes_samples():
    """Splitting needs every activation to keep the batch first; the error names the node."""

    class Mixer(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3, padding=1)
            self.bn = nn.BatchNorm2d(2)
            self.fc = nn.Linear(2 * 4 * 4, 3)

        def forward(self, x):
            y = nn.functional.reshape(self.bn(self.conv(x)), (1, 8 * 2 * 4 * 4))   # all samples in one row
            return self.fc(nn.functional.reshape(y, (8, 2 * 4 * 4)))

    graph = trace(Mixer().init_parameters(0), (8, 1, 4, 4), loss=nn.CrossEntropyLoss())
    with pytest.raises(mdn.ShapeError, match="keep the batch.*bn='sub-batch'"):
        split_graph(graph, 2)


def test_exact_batch_norm_whose_input_is_read_elsewhere():
    """A BatchNorm input that another node reads too (DenseNet, pre-activation shortcuts) is normalized
    through a per-sub-batch copy; parameters still follow the unsplit run."""

    class PreAdd(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.fc = nn.Linear(4 * 8 * 8, 10)

        def forward(self, x):
            y = self.conv(x)
            return self.fc(nn.functional.flatten(nn.relu(self.bn(y)) + y))

    shape = (8, 3, 8, 8)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(shape), rng.integers(0, 10, shape[0])

    def train(memory):
        net = PreAdd().init_parameters(0)
        trainer = mdn.compile(net, shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.1, momentum=0.9), memory=memory,
                              dtype=np.float64)
        for _ in range(3):
            trainer.step(x, y)
        return trainer, state(net)

    graph = trace(PreAdd(), (4,) + shape[1:], loss=nn.CrossEntropyLoss())
    assert any(n.op.name == "reshape" and n.path == "bn[1]" for n in split_graph(graph, 2).nodes)
    _, ref = train(None)
    with pytest.raises(mdn.MemoryBudgetError) as e:
        train(MemoryConfig(budget=1, sub_batching=False))
    trainer, got = train(MemoryConfig(budget=e.value.minimum_bytes - 1, bn="exact", check=True, poison=True))
    assert isinstance(trainer.plan, StagedPlan) and trainer.plan.k >= 2
    assert trainer.measured_peak_bytes == trainer.plan.peak_bytes < e.value.minimum_bytes
    errors = relative_errors(got, ref)
    assert max(errors.values()) <= 1e-10


def test_exact_batch_norm_too_small_even_for_one_sample_names_the_minimum():
    build, shape = NETS["resnet18"]
    with pytest.raises(mdn.MemoryBudgetError, match="exact BatchNorm statistics, even with sub-batches of 1") as e:
        mdn.compile(build(), shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.01, momentum=0.9),
                    memory=MemoryConfig(budget=4096, bn="exact"))
    assert e.value.minimum_bytes > 4096


def test_a_policy_that_finds_no_split_says_so_where_the_planner_would():
    """A fixed policy (Chen et al.'s segments) finds no plan whole or split at a budget above the
    planner's own minimum: the error names the policy and that minimum, below the budget, not a
    budget "below the minimum"."""
    from minidnn.memory.subbatch import plan_step
    from minidnn.report import shapes_only, step_splits, training_schedule
    shape = (16, 3, 32, 32)
    with shapes_only():
        net = models.get("resnet20")
    sched = training_schedule(net, shape)[1]
    config = MemoryConfig(budget=0.3, policy="checkpoint_sqrt", profile="v100-16gb")
    with pytest.raises(mdn.MemoryBudgetError, match="the 'checkpoint_sqrt' policy finds no plan") as e:
        plan_step(sched, config, splits=step_splits(net, shape))
    assert e.value.minimum_bytes < e.value.budget_bytes
    assert "use policy 'auto'" in str(e.value)
    auto = plan_step(sched, MemoryConfig(budget=e.value.budget_bytes, profile="v100-16gb"),
                     splits=step_splits(net, shape))
    assert auto.peak_bytes <= e.value.budget_bytes


class _Features(nn.Module):
    """Convolution, pooling, BatchNorm1d on (N, C), Linear: the convolution's activations set the
    minimum, and BatchNorm1d refuses a sub-batch of one sample."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm1d(8), nn.Linear(8, 4)

    def forward(self, x):
        y = nn.flatten(nn.functional.adaptive_avg_pool2d(nn.relu(self.conv(x))))
        return self.fc(nn.relu(self.bn(y)))


def test_a_split_that_a_layer_refuses_is_not_a_split():
    """With exact BatchNorm statistics, a k whose sub-batch BatchNorm1d refuses (one sample) is left out,
    not raised as a ShapeError: a budget that sub-batches of 2 meet is met, and one that only sub-batches
    of 1 could meet names the minimum at the smallest sub-batch the network takes."""
    shape = (4, 8, 32, 32)

    def compile_at(budget, sub_batching=True):
        return mdn.compile(_Features().init_parameters(seed=0), shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.1),
                           memory=MemoryConfig(budget=budget, sub_batching=sub_batching))
    with pytest.raises(mdn.MemoryBudgetError) as whole:
        compile_at(1, sub_batching=False)
    budget = whole.value.minimum_bytes * 4 // 5
    with pytest.raises(mdn.MemoryBudgetError):
        compile_at(budget, sub_batching=False)
    trainer = compile_at(budget)
    assert isinstance(trainer.plan, StagedPlan) and trainer.plan.sub_batch == 2
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert np.isfinite(trainer.step(x, np.arange(4) % 4))
    assert trainer.measured_peak_bytes == trainer.plan.peak_bytes < whole.value.minimum_bytes
    with pytest.raises(mdn.MemoryBudgetError, match="sub-batches of 2 samples") as e:
        compile_at(1)
    assert compile_at(e.value.minimum_bytes).plan.peak_bytes <= e.value.minimum_bytes
