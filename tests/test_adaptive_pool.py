"""Adaptive average and max pooling: PyTorch's windows at awkward sizes, its tie rule, bad sizes,
and the VGG and AlexNet inputs they open (each of torchvision's models at a size other than 224).

The op cases go through the shared harness (tests/harness.py): forward in float64 and float32
against a NumPy reference written here, gradients against float64 central differences, and
forward and gradients against ``torch.nn.functional``; on "cuda" too where a GPU is present.
"""
import math
import re

import numpy as np
import pytest

import minidnn as mdn
from harness import DUMMY, OpCase, check_backward, check_forward, check_torch, compile_case, host, rng_for
from minidnn import nn, ops, optim
from minidnn.autograd import build_schedule
from minidnn.backend import get_backend
from minidnn.errors import ShapeError
from minidnn.graph import trace
from minidnn.memory import minimum_bytes

try:
    from minidnn import models
except ImportError:  # the repository's top-level models/ folder before it is installed as minidnn.models
    import models

try:
    import torch
    from torch import nn as tnn
except ImportError:
    torch = tnn = None


# ----------------------------------------------------------- NumPy reference
def windows(size, out):
    """PyTorch's adaptive windows, from their definition in real arithmetic."""
    return [(math.floor(i * size / out), math.ceil((i + 1) * size / out)) for i in range(out)]


def ref_adaptive(x, output_size, reduce):
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else output_size
    oh, ow = oh or x.shape[2], ow or x.shape[3]
    y = np.empty(x.shape[:2] + (oh, ow))
    for i, (h0, h1) in enumerate(windows(x.shape[2], oh)):
        for j, (w0, w1) in enumerate(windows(x.shape[3], ow)):
            y[:, :, i, j] = reduce(x[:, :, h0:h1, w0:w1], axis=(2, 3))
    return y


def randn(name, shape):
    return rng_for(name, shape).standard_normal(shape)


def distinct(name, shape):
    """No ties and no two values within 2 * eps, so central differences never cross a kink."""
    return rng_for(name, shape).permutation(int(np.prod(shape))).reshape(shape) * 0.01 - 1.0


def ties(name, shape):
    """Three values only: most windows hold their maximum several times."""
    return rng_for(name, shape).integers(0, 3, shape).astype(np.float64)


def avg_case(name, shape, output_size):
    return OpCase(name, lambda x: ops.adaptive_avg_pool2d(x, output_size), [randn(name, shape)],
                  lambda x: ref_adaptive(x, output_size, np.mean),
                  torch=lambda F, x: F.adaptive_avg_pool2d(x, output_size))


def max_case(name, shape, output_size, make=distinct):
    return OpCase(name, lambda x: ops.adaptive_max_pool2d(x, output_size), [make(name, shape)],
                  lambda x: ref_adaptive(x, output_size, np.max),
                  torch=lambda F, x: F.adaptive_max_pool2d(x, output_size))


SIZES = [   # (input shape, output_size): shrinking, growing, non-square, None keeping a dimension
    ((2, 3, 7, 7), 3),
    ((2, 2, 5, 5), 2),
    ((1, 3, 1, 1), 4),
    ((2, 2, 9, 6), (4, 5)),
    ((1, 2, 4, 11), (7, 3)),
    ((2, 1, 5, 9), (None, 4)),
    ((3, 2, 6, 4), (1, 1)),
]
CASES = ([avg_case(f"avg_{s[2]}x{s[3]}_to_{o}", s, o) for s, o in SIZES]
         + [max_case(f"max_{s[2]}x{s[3]}_to_{o}", s, o) for s, o in SIZES])
TIES = [max_case(f"max_ties_{s[2]}x{s[3]}_to_{o}", s, o, ties) for s, o in SIZES if s[2] * s[3] > 1]


@pytest.mark.parametrize("case", [c.param("forward") for c in CASES + TIES])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_forward(case, dtype, device):
    check_forward(case, dtype, device)


@pytest.mark.parametrize("case", [c.param("backward") for c in CASES])
def test_backward_by_central_differences(case, device):
    check_backward(case, device)


@pytest.mark.parametrize("case", [c.param("torch") for c in CASES + TIES])
def test_against_torch(case, device):
    """With ties, the gradient goes where torch sends it: the first maximum of each window."""
    check_torch(case, device)


def test_ties_go_to_the_first_maximum():
    x = np.array([[[[1.0, 3.0, 3.0], [3.0, 0.0, 3.0]]]])      # one window (2x3 -> 1x1), four maxima
    case = OpCase("first_max", lambda v: ops.adaptive_max_pool2d(v, 1), [x], lambda v: v.max(axis=(2, 3),
                  keepdims=True))
    trainer, net = compile_case(case)
    trainer.step(DUMMY, np.zeros((1, 1, 1, 1)))
    grad = host(net.holders()[0].grad)
    assert np.count_nonzero(grad) == 1 and grad[0, 0, 0, 1] != 0


def test_nan_propagates_like_torch(device):
    torch = pytest.importorskip("torch")
    x = distinct("nan", (1, 2, 5, 4))
    x[0, 0, 1, 1] = x[0, 1, 3, 2] = x[0, 1, 4, 3] = np.nan
    case = OpCase("max_nan", lambda v: ops.adaptive_max_pool2d(v, (3, 2)), [x], lambda v: v)
    trainer, _ = compile_case(case, device=device)
    want = torch.nn.functional.adaptive_max_pool2d(torch.tensor(x), (3, 2)).numpy()
    np.testing.assert_array_equal(host(trainer.predict(DUMMY)), want)


def test_kernels_refuse_bad_buffers():
    _C = pytest.importorskip("minidnn._C")
    x, y = np.zeros((2, 3, 5, 4)), np.zeros((2, 3, 2, 3))
    with pytest.raises(ValueError, match="'gx'"):
        _C.adaptive_maxpool2d_backward(x, y, np.zeros((2, 3, 4, 5)))
    with pytest.raises(ValueError, match="'y'"):
        _C.adaptive_avgpool2d_forward(x, np.zeros((2, 4, 2, 3)))
    with pytest.raises(ValueError, match="non-empty"):
        _C.adaptive_maxpool2d_forward(x, np.zeros((2, 3, 0, 3)))
    with pytest.raises(ValueError):
        _C.adaptive_avgpool2d_forward(x, np.zeros((2, 3, 2, 6))[:, :, :, ::2])    # not contiguous
    with pytest.raises(TypeError):
        _C.adaptive_avgpool2d_backward(y.astype(np.float32), np.zeros((2, 3, 5, 4)))


# ------------------------------------------------------------- what is recorded
def _ops_of(module, shape):
    return [n.op.name for n in trace(module, shape).nodes]


def test_recorded_ops():
    assert _ops_of(nn.AdaptiveAvgPool2d((3, 2)), (1, 2, 7, 5)) == ["adaptive_avg_pool2d"]
    assert _ops_of(nn.AdaptiveMaxPool2d(3), (1, 2, 7, 5)) == ["adaptive_max_pool2d"]
    assert _ops_of(nn.AdaptiveAvgPool2d(1), (1, 2, 7, 5)) == ["global_avg_pool"]
    # output size = input size: every window is one pixel, the identity, and nothing is recorded
    assert _ops_of(nn.Sequential(nn.ReLU(), nn.AdaptiveAvgPool2d((None, 5))), (1, 2, 7, 5)) == ["relu"]
    assert _ops_of(nn.Sequential(nn.ReLU(), nn.AdaptiveMaxPool2d((7, None))), (1, 2, 7, 5)) == ["relu"]
    assert tuple(trace(nn.AdaptiveMaxPool2d((None, 2)), (3, 2, 7, 5)).outputs[0].shape) == (3, 2, 7, 2)


def test_backward_keeps_what_it_reads():
    """Max pool's backward recomputes the argmax from x; avg pool's reads only shapes."""
    assert ops.pool.AdaptiveMaxPool2dOp.saved_inputs == (0,)
    assert ops.pool.AdaptiveAvgPool2dOp.saved_inputs == () == ops.pool.AdaptiveAvgPool2dOp.saved_outputs


class _PoolNet(nn.Module):
    """Each adaptive pool reads a convolution's output, which no other backward keeps: only the
    pool's own declaration keeps it."""

    def __init__(self, width=8):
        super().__init__()
        self.features = nn.Sequential(*[m for c in (3, width) for m in
                                        (nn.Conv2d(c, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU())],
                                      nn.Conv2d(width, width, 3, padding=1))
        self.pool1 = nn.AdaptiveMaxPool2d((5, 7))
        self.conv = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.pool2 = nn.AdaptiveAvgPool2d(3)
        self.fc = nn.Linear(2 * width * 3 * 3, 10)

    def forward(self, x):
        x = self.pool1(self.features(x))
        return self.fc(nn.flatten(nn.relu(self.pool2(self.conv(x)))))


POOL_NET_INPUT = (16, 3, 13, 11)


def _train_pool_net(budget):
    trainer = mdn.compile(_PoolNet().init_parameters(0), POOL_NET_INPUT, nn.CrossEntropyLoss(),
                          optim.SGD(lr=0.1, momentum=0.9),
                          memory=mdn.MemoryConfig(budget=budget, poison=True, check=True, algorithms="default",
                                                  sub_batching=False))
    rng = np.random.default_rng(3)
    losses = [trainer.step(rng.standard_normal(POOL_NET_INPUT).astype(np.float32),
                           rng.integers(0, 10, POOL_NET_INPUT[0])) for _ in range(2)]
    return trainer, losses, {k: host(v) for k, v in trainer.net.state_dict().items()}


@pytest.mark.parametrize("where", [0.0, 0.5], ids=["minimum", "midway"])
def test_budgeted_training_is_bitwise_identical(where):
    """The planner sees what each backward keeps (x for max, nothing for avg): evicting by that
    changes no bit, and poison mode shows that no backward reads a freed buffer. Budgets: the
    minimum, and midway between it and the unlimited plan's peak."""
    ref, ref_losses, ref_state = _train_pool_net(None)
    schedule = build_schedule(trace(_PoolNet(), POOL_NET_INPUT, loss=nn.CrossEntropyLoss()),
                              optimizer=optim.SGD(lr=0.1, momentum=0.9))
    config = mdn.MemoryConfig(algorithms="default")
    low = minimum_bytes(schedule, config, get_backend("cpu").planning_cost(None, config.profile))
    trainer, losses, state = _train_pool_net(int(low + where * (ref.plan.peak_bytes - low)))
    assert trainer.plan.evictions and not trainer.plan.algorithm_changes
    assert trainer.measured_peak_bytes == trainer.plan.peak_bytes < ref.plan.peak_bytes
    assert losses == ref_losses
    for k in ref_state:
        assert np.array_equal(state[k], ref_state[k]), k


# ----------------------------------------------------------------- bad sizes
BAD = [0, -1, (2, 0), (-3, 2), (0, None), 2.5, None, (1, 2, 3), (True, 2), "7"]


@pytest.mark.parametrize("layer", [nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d])
@pytest.mark.parametrize("size", BAD, ids=repr)
def test_bad_output_size_names_the_layer(layer, size):
    with pytest.raises(ShapeError, match=f"{layer.__name__}: output_size must be .*got {re.escape(repr(size))}$"):
        layer(size)


class _Pools(nn.Module):
    def __init__(self, fn, size):
        super().__init__()
        self.fn, self.size = fn, size

    def forward(self, x):
        return self.fn(x, self.size)


@pytest.mark.parametrize("kind", ["avg", "max"])
def test_bad_functional_output_size_names_the_module(kind):
    fn, layer = getattr(nn.functional, f"adaptive_{kind}_pool2d"), f"Adaptive{kind.title()}Pool2d"
    with pytest.raises(ShapeError, match=rf"^1 \(adaptive_{kind}_pool2d\): {layer}: output_size .*\(3, 0\)"):
        trace(nn.Sequential(nn.ReLU(), _Pools(fn, (3, 0))), (1, 2, 5, 5))
    with pytest.raises(ShapeError, match=r"^1 .*4-D"):
        trace(nn.Sequential(nn.ReLU(), _Pools(fn, 2)), (2, 5))


def test_return_indices_is_refused():
    with pytest.raises(ValueError, match="return_indices"):
        nn.AdaptiveMaxPool2d(2, return_indices=True)
    assert repr(nn.AdaptiveMaxPool2d((None, 3))).endswith("(output_size=(None, 3))")


# --------------------------------------------- VGG and AlexNet at other sizes
VGG11 = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]   # torchvision's configuration A


def torch_vgg11_bn(num_classes):
    """torchvision's vgg11_bn written with torch.nn layers (dropout 0, so a step is deterministic)."""
    layers, c = [], 3
    for v in VGG11:
        if v == "M":
            layers.append(tnn.MaxPool2d(2, 2))
        else:
            layers += [tnn.Conv2d(c, v, 3, padding=1), tnn.BatchNorm2d(v), tnn.ReLU(inplace=True)]
            c = v
    net = tnn.Module()
    net.features = tnn.Sequential(*layers)
    net.avgpool = tnn.AdaptiveAvgPool2d((7, 7))
    net.classifier = tnn.Sequential(tnn.Linear(512 * 7 * 7, 4096), tnn.ReLU(True), tnn.Dropout(0.0),
                                    tnn.Linear(4096, 4096), tnn.ReLU(True), tnn.Dropout(0.0),
                                    tnn.Linear(4096, num_classes))
    return net


def torch_alexnet(num_classes):
    net = tnn.Module()
    net.features = tnn.Sequential(
        tnn.Conv2d(3, 64, 11, stride=4, padding=2), tnn.ReLU(True), tnn.MaxPool2d(3, 2),
        tnn.Conv2d(64, 192, 5, padding=2), tnn.ReLU(True), tnn.MaxPool2d(3, 2),
        tnn.Conv2d(192, 384, 3, padding=1), tnn.ReLU(True), tnn.Conv2d(384, 256, 3, padding=1), tnn.ReLU(True),
        tnn.Conv2d(256, 256, 3, padding=1), tnn.ReLU(True), tnn.MaxPool2d(3, 2))
    net.avgpool = tnn.AdaptiveAvgPool2d((6, 6))
    net.classifier = tnn.Sequential(tnn.Dropout(0.0), tnn.Linear(256 * 6 * 6, 4096), tnn.ReLU(True),
                                    tnn.Dropout(0.0), tnn.Linear(4096, 4096), tnn.ReLU(True),
                                    tnn.Linear(4096, num_classes))
    return net


def _torch_forward(tnet, x):
    x = tnet.avgpool(tnet.features(torch.from_numpy(x)))
    return tnet.classifier(torch.flatten(x, 1))


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("name,size,torch_net", [("vgg11_bn", 64, torch_vgg11_bn), ("alexnet", 96, torch_alexnet)])
def test_torchvision_model_at_another_size_matches_torch(name, size, torch_net):
    """Same weights, one SGD step in float64: the same loss and parameters after it, then the same
    eval output (VGG: 2x2 features spread over 7x7 windows; AlexNet: 2x2 over 6x6)."""
    classes, shape = 10, (2, 3, size, size)
    net = models.get(name, num_classes=classes, dropout=0.0)
    tnet = torch_net(classes)
    tnet.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})   # strict
    tnet.to(torch.float64)
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape)
    y = rng.integers(0, classes, shape[0]).astype(np.int64)

    trainer = mdn.compile(net, shape, nn.CrossEntropyLoss(), optimizer=optim.SGD(lr=0.5), dtype=np.float64)
    assert "adaptive_avg_pool2d" in [n.op.name for n in trace(net, shape, np.float64).nodes]
    loss = trainer.step(x, y)
    topt = torch.optim.SGD(tnet.parameters(), lr=0.5)
    tloss = tnn.functional.cross_entropy(_torch_forward(tnet, x), torch.from_numpy(y))
    tloss.backward()
    topt.step()
    assert loss == pytest.approx(tloss.item(), rel=1e-12)
    tparams = dict(tnet.named_parameters())
    for n, p in net.named_parameters():    # conv biases before a BatchNorm get rounding noise only: atol
        np.testing.assert_allclose(host(p.data), tparams[n].detach().numpy(), rtol=1e-9, atol=1e-12, err_msg=n)

    tnet.eval()
    with torch.no_grad():
        want = _torch_forward(tnet, x).numpy()
    np.testing.assert_allclose(trainer.predict(x), want, rtol=1e-9, atol=1e-12)
