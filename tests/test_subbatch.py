"""Sub-batching: a mini-batch that cannot fit at its full size is split, and still trains the same.

Without BatchNorm (whose statistics are per sub-batch by design), k sub-batches
accumulating 1/k-scaled gradients followed by one update give the unsplit
run's parameters up to float rounding.
"""
import numpy as np
import pytest

import minidnn as mdn
from harness import host
from minidnn import models, nn, optim
from minidnn.memory import MemoryConfig
from minidnn.memory.subbatch import SubBatchPlan

NETS = {
    "lenet5": (lambda: models.get("lenet5"), (16, 1, 28, 28)),
    "vgg11": (lambda: models.get("vgg11", num_classes=10, image_size=64, dropout=0.0), (8, 3, 64, 64)),
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


def run(name, budget, steps=3, dtype=np.float32, device="cpu"):
    build, shape = NETS[name]
    net = build().init_parameters(0)
    trainer = mdn.compile(net, shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.01, momentum=0.9),
                          memory=MemoryConfig(budget=budget, poison=True, check=True), dtype=dtype, device=device)
    rng = np.random.default_rng(3)
    losses = [trainer.step(rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0]))
              for _ in range(steps)]
    return trainer, losses, [host(p.data).copy() for p in net.parameters()]


@pytest.mark.parametrize("name, dtype, rtol", [("lenet5", np.float32, 1e-5), ("vgg11", np.float32, 1e-5),
                                               ("vgg11", np.float64, 1e-12)])
def test_sub_batches_train_like_the_full_batch(name, dtype, rtol, device):
    """In float64 the split step equals the unsplit one to 1e-12: the semantics are exact; in
    float32 the gradients' other summation order stays within 1e-5 over 3 steps."""
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
