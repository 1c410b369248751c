"""A network of GELU, SiLU, LayerNorm, GroupNorm, BatchNorm1d, Upsample/interpolate and slicing
(issue #31 item 10), written once over a layer namespace and run by both frameworks.

State_dicts move between PyTorch and minidnn unchanged (names, shapes, order); forward, loss and
every gradient match PyTorch in float64, and so do one SGD step, the running statistics and
eval-mode predictions. The planner sees the new ops like any other: under a budget that evicts,
training is bitwise identical to unlimited memory, and under one that splits the mini-batch,
BatchNorm1d keeps the full batch's statistics (BatchNorm2d's op underneath).
"""
import numpy as np
import pytest

import minidnn as mdn
from harness import host, rng_for, step_matches_torch
from minidnn import nn as mnn
from minidnn import optim
from minidnn.memory import MemoryConfig
from minidnn.memory.subbatch import StagedPlan

SHAPE = (8, 3, 6, 6)
CLASSES = 5


def make_net(nn):
    """The network over ``nn`` (minidnn.nn or torch.nn); shapes in the comments for SHAPE."""
    F = nn.functional

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(30, 16)
            self.bn = nn.BatchNorm1d(16)                      # on (N, C)
            self.bn_seq = nn.BatchNorm1d(4)                   # on (N, C, L)
            self.ln = nn.LayerNorm(16)
            self.out = nn.Linear(16, CLASSES)

        def forward(self, y):
            h = self.bn(self.fc(y.flatten(1)))                # (N, 16)
            h = self.bn_seq(h.view(h.size(0), 4, 4)).flatten(1)
            return self.out(self.ln(F.silu(h)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
            self.gn = nn.GroupNorm(2, 8)
            self.act1 = nn.GELU()
            self.up1 = nn.Upsample(scale_factor=2)
            self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1)
            self.act2 = nn.GELU(approximate="tanh")
            self.up2 = nn.Upsample(size=(7, 5), mode="bilinear")
            self.ln = nn.LayerNorm([5])
            self.up3 = nn.Upsample(scale_factor=1.5, mode="bilinear", align_corners=True)
            self.act3 = nn.SiLU()
            self.head = Head()

        def forward(self, x):
            y = self.act1(self.gn(self.conv1(x)))             # (N, 8, 6, 6)
            y = self.act2(self.conv2(self.up1(y)))            # (N, 8, 6, 6)
            y = self.ln(self.up2(y))                          # (N, 8, 7, 5)
            y = self.act3(self.up3(y[:, 1:7]))                # (N, 6, 10, 7)
            y = F.interpolate(y[..., ::2], scale_factor=(0.5, 1.5))   # (N, 6, 5, 6)
            return self.head(y[:, 0] + y[:, -1])              # (N, 5, 6) -> (N, CLASSES)

    return Net


def _pair(seed=0):
    torch = pytest.importorskip("torch")
    net = make_net(mnn)().init_parameters(seed)
    tnet = make_net(torch.nn)().to(torch.float64)
    tnet.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    return net, tnet, torch


def _batch(step=0, n=SHAPE[0]):
    rng = rng_for("layers_more", step)
    return rng.standard_normal((n,) + SHAPE[1:]), rng.integers(0, CLASSES, n).astype(np.int64)


def test_state_dicts_move_unchanged_both_ways():
    torch = pytest.importorskip("torch")
    net, tnet = make_net(mnn)(), make_net(torch.nn)()
    sd, tsd = net.state_dict(), tnet.state_dict()
    assert list(sd) == list(tsd)
    assert {k: tuple(np.shape(v)) for k, v in sd.items()} == {k: tuple(v.shape) for k, v in tsd.items()}
    for k in ["gn.weight", "ln.bias", "head.bn.running_var", "head.bn_seq.num_batches_tracked", "head.ln.weight"]:
        assert k in sd
    # PyTorch's (randomly initialized, trained-looking) state into minidnn, and back
    with torch.no_grad():
        for v in tnet.state_dict().values():
            if v.is_floating_point():
                v.copy_(torch.randn(v.shape))
    net.load_state_dict({k: v.numpy() for k, v in tnet.state_dict().items()})
    for k, v in net.state_dict().items():
        np.testing.assert_array_equal(host(v), tsd[k].numpy(), err_msg=k)
    back = make_net(torch.nn)()
    back.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    for k, v in back.state_dict().items():
        assert torch.equal(v, tsd[k]), k


def test_forward_and_every_gradient_match_torch():
    net, tnet, torch = _pair()
    x, y = _batch()
    trainer = mdn.compile(net, SHAPE, mnn.CrossEntropyLoss(), optimizer=None, dtype=np.float64,
                          memory=MemoryConfig(check=True, poison=True))
    step_matches_torch(trainer, net, tnet, x, y, rtol=1e-8)


def test_one_sgd_step_and_eval_match_torch():
    net, tnet, torch = _pair(seed=1)
    hp = dict(lr=0.1, momentum=0.9)
    trainer = mdn.compile(net, SHAPE, mnn.CrossEntropyLoss(), optimizer=optim.SGD(**hp), dtype=np.float64)
    topt = torch.optim.SGD(tnet.parameters(), **hp)
    for step in range(2):
        x, y = _batch(1 + step)
        loss = trainer.step(x, y)
        topt.zero_grad()
        tloss = torch.nn.functional.cross_entropy(tnet(torch.from_numpy(x)), torch.from_numpy(y))
        tloss.backward()
        topt.step()
        assert abs(loss - tloss.item()) <= 1e-9 * abs(tloss.item())
    tsd = tnet.state_dict()
    for k, v in net.state_dict().items():               # parameters, running statistics, batch counts
        np.testing.assert_allclose(host(v), tsd[k].numpy(), rtol=1e-8, atol=1e-12, err_msg=k)
    x, _ = _batch(9)
    tnet.eval()
    np.testing.assert_allclose(trainer.predict(x), tnet(torch.from_numpy(x)).detach().numpy(), rtol=1e-8,
                               atol=1e-10)


# ------------------------------------------------------------------ the planner
def _train(memory, dtype=np.float32, steps=2):
    net = make_net(mnn)().init_parameters(3)
    trainer = mdn.compile(net, SHAPE, mnn.CrossEntropyLoss(), optim.SGD(lr=0.05, momentum=0.9), memory=memory,
                          dtype=dtype)
    losses = [trainer.step(*_batch(10 + s)) for s in range(steps)]
    return trainer, losses, {k: host(v) for k, v in net.state_dict().items()}


@pytest.mark.parametrize("policy, where", [("auto", 0.5), ("auto", 0.0), ("recompute", 0.5)])
def test_budgeted_training_is_bitwise_identical(policy, where):
    """Offloaded, prefetched or recomputed, the new ops give the unlimited run's bits: budgets
    between the minimum and the unlimited peak (``where``: 0 the minimum, 1 the peak)."""
    unlimited, ref_losses, ref_state = _train(MemoryConfig(algorithms="default", sub_batching=False))
    with pytest.raises(mdn.MemoryBudgetError) as e:
        _train(MemoryConfig(budget=1, algorithms="default", sub_batching=False))
    lo, hi = e.value.minimum_bytes, unlimited.plan.peak_bytes
    assert lo < hi
    trainer, losses, state = _train(MemoryConfig(budget=int(lo + where * (hi - lo)), policy=policy,
                                                 algorithms="default", sub_batching=False, poison=True, check=True))
    plan = trainer.plan
    assert plan.evictions, "a tight budget should evict something"
    if policy == "recompute":             # the GroupNorm's output, as it happens: its forward runs again
        assert any(v.kind == "recompute" for v in plan.evictions.values())
    assert trainer.measured_peak_bytes == plan.peak_bytes <= plan.budget < hi
    assert losses == ref_losses
    for k in ref_state:
        assert np.array_equal(state[k], ref_state[k]), k


def test_split_mini_batch_keeps_batch_norm1d_exact():
    """Below the full batch's minimum, the step runs as sub-batches, BatchNorm1d (through
    BatchNorm2d's op) with the full batch's statistics: the unsplit run's result, up to rounding."""
    _, ref_losses, ref_state = _train(None, np.float64)
    with pytest.raises(mdn.MemoryBudgetError) as e:
        _train(MemoryConfig(budget=1, sub_batching=False), np.float64)
    trainer, losses, state = _train(MemoryConfig(budget=e.value.minimum_bytes - 1, check=True, poison=True),
                                    np.float64)
    plan = trainer.plan
    assert isinstance(plan, StagedPlan) and plan.k >= 2
    assert trainer.measured_peak_bytes == plan.peak_bytes < e.value.minimum_bytes
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)
    for k in ref_state:
        np.testing.assert_allclose(state[k], ref_state[k], rtol=1e-9, atol=1e-12, err_msg=k)
