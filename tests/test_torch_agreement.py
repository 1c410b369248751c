"""Whole-network agreement with PyTorch: losses, every gradient, optimizer trajectories, BN statistics.

Each network (tests/networks.py) is written once as a class factory over a layer
namespace (``minidnn.nn`` or ``torch.nn``) and a ``cat`` function, so both frameworks
get exactly the same structure and the same state_dict names. Weights are made by
minidnn and copied into torch through the state_dict.
"""

import numpy as np
import pytest

import minidnn
from harness import host
from networks import make_densenet, make_lenet, make_resnet
from minidnn import nn as mnn
from minidnn import optim

torch = pytest.importorskip("torch")
from torch import nn as tnn  # noqa: E402

TINY = 1e-30


def rel_err(a, b):
    """Norm-relative difference: max|a - b| / max|b|."""
    a = np.asarray(host(a), np.float64)
    b = np.asarray(host(b), np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), TINY))


NETS = {
    "lenet": (make_lenet, (8, 1, 28, 28)),
    "resnet": (make_resnet, (8, 3, 16, 16)),
    "densenet": (make_densenet, (8, 3, 16, 16)),
}


def build_pair(name, dtype=np.float32, seed=0):
    """(minidnn net, torch net) with identical weights; BN affine params and stats randomized."""
    factory, shape = NETS[name]
    net = factory(mnn, minidnn.nn.functional.cat).init_parameters(seed)
    rng = np.random.default_rng(seed + 100)
    sd = {k: np.array(v) for k, v in net.state_dict().items()}
    for mp, m in net.named_modules():
        if isinstance(m, mnn.BatchNorm2d):
            p = f"{mp}." if mp else ""
            sd[p + "weight"] = rng.uniform(0.5, 1.5, m.num_features).astype(np.float32)
            sd[p + "bias"] = rng.normal(0, 0.1, m.num_features).astype(np.float32)
            sd[p + "running_mean"] = rng.normal(0, 0.1, m.num_features).astype(np.float32)
            sd[p + "running_var"] = rng.uniform(0.5, 1.5, m.num_features).astype(np.float32)
    net.load_state_dict(sd)
    tnet = factory(tnn, torch.cat)
    tdtype = torch.float64 if np.dtype(dtype) == np.float64 else torch.float32
    tnet.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    tnet.to(tdtype)
    assert list(net.state_dict()) == list(tnet.state_dict())
    return net, tnet, shape


def batch(shape, step, dtype=np.float32, classes=10):
    rng = np.random.default_rng(1000 + step)
    x = rng.standard_normal(shape).astype(dtype)
    y = rng.integers(0, classes, shape[0]).astype(np.int64)
    return x, y


def torch_loss(tnet, x, y):
    out = tnet(torch.from_numpy(x))
    return tnn.functional.cross_entropy(out, torch.from_numpy(y))


def assert_buffers_match(net, tnet, tol):
    tsd = tnet.state_dict()
    for k, v in net.state_dict().items():
        if k.endswith("num_batches_tracked"):
            assert host(v).shape == () and int(v) == int(tsd[k]), k
        elif "running" in k:
            assert rel_err(v, tsd[k].detach().numpy()) < tol, k


def test_state_dict_names_match_torch():
    for name in NETS:
        net, tnet, _ = build_pair(name)
        assert list(net.state_dict()) == list(tnet.state_dict())
        for k, v in net.state_dict().items():
            assert tuple(v.shape) == tuple(tnet.state_dict()[k].shape), k


def test_torch_state_dict_loads_into_minidnn():
    """torch -> minidnn, BN buffers included (regression: num_batches_tracked was stored as shape (1,))."""
    net, tnet, _ = build_pair("resnet")
    tnet.bn1.num_batches_tracked.fill_(7)
    with torch.no_grad():
        for v in tnet.state_dict().values():
            if v.is_floating_point():
                v.mul_(1.5).add_(0.25)                 # torch's weights now differ from minidnn's
    net.load_state_dict({k: v.numpy() for k, v in tnet.state_dict().items()})
    assert net.state_dict()["bn1.num_batches_tracked"].shape == ()
    assert int(net.state_dict()["bn1.num_batches_tracked"]) == 7
    for k, v in tnet.state_dict().items():
        assert np.array_equal(net.state_dict()[k], v.numpy()), k


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-4), (np.float64, 1e-10)])
@pytest.mark.parametrize("name", list(NETS))
def test_loss_and_every_gradient(name, dtype, tol, device):
    net, tnet, shape = build_pair(name, dtype)
    trainer = minidnn.compile(net, shape, mnn.CrossEntropyLoss(), optimizer=None, dtype=dtype, device=device,
                              memory=minidnn.MemoryConfig(check=True, poison=True))
    x, y = batch(shape, 0, dtype)
    loss = trainer.step(x, y)
    tloss = torch_loss(tnet, x, y)
    tloss.backward()
    assert abs(loss - tloss.item()) <= tol * abs(tloss.item())
    tparams = dict(tnet.named_parameters())
    names = [n for n, _ in net.named_parameters()]
    assert names == list(tparams)
    for n, p in net.named_parameters():
        assert p.grad is not None, n
        assert p.grad.dtype == np.dtype(dtype)
        g = tparams[n].grad.numpy()
        assert np.abs(g).max() > 0, n
        assert rel_err(p.grad, g) < tol, (n, rel_err(p.grad, g))
    # the forward in training mode moved the BN statistics exactly as torch's did
    assert_buffers_match(net, tnet, tol)


def _train_both(name, optimizer, torch_optimizer, steps, device="cpu"):
    """``steps`` steps of the same network in both frameworks; (net, tnet, losses, torch losses, trainer)."""
    net, tnet, shape = build_pair(name)
    trainer = minidnn.compile(net, shape, mnn.CrossEntropyLoss(), optimizer=optimizer, device=device,
                              memory=minidnn.MemoryConfig(check=True, poison=True))
    topt = torch_optimizer(tnet.parameters())
    losses, tlosses = [], []
    for s in range(steps):
        x, y = batch(shape, s)
        losses.append(trainer.step(x, y))
        topt.zero_grad()
        tl = torch_loss(tnet, x, y)
        tl.backward()
        topt.step()
        tlosses.append(tl.item())
    return net, tnet, losses, tlosses, trainer


def assert_same_trajectory(net, tnet, losses, tlosses, tol=1e-4):
    for s, (a, b) in enumerate(zip(losses, tlosses)):
        assert abs(a - b) <= tol * abs(b), (s, a, b)
    tparams = dict(tnet.named_parameters())
    for n, p in net.named_parameters():
        assert rel_err(p.data, tparams[n].detach().numpy()) < tol, n


def _run_sgd(name, nesterov, steps=5, device="cpu"):
    hp = dict(lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=nesterov)
    return _train_both(name, optim.SGD(**hp), lambda ps: torch.optim.SGD(ps, **hp), steps, device)


@pytest.mark.parametrize("nesterov", [False, True], ids=["momentum", "nesterov"])
@pytest.mark.parametrize("name", list(NETS))
def test_sgd_trajectory(name, nesterov, device):
    net, tnet, losses, tlosses, _ = _run_sgd(name, nesterov, device=device)
    # the weights actually moved, so agreement of the final parameters means something
    init, _, _ = build_pair(name)
    moved = max(rel_err(p.data, init_p.data) for (_, p), (_, init_p)
                in zip(net.named_parameters(), init.named_parameters()))
    assert moved > 1e-3
    assert_same_trajectory(net, tnet, losses, tlosses)
    assert_buffers_match(net, tnet, 1e-4)


def test_adam_resnet(device):
    net, tnet, losses, tlosses, _ = _train_both(
        "resnet", optim.Adam(lr=1e-3, weight_decay=1e-4),
        lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=1e-4), 5, device)
    assert_same_trajectory(net, tnet, losses, tlosses)
    assert_buffers_match(net, tnet, 1e-4)


def test_adamw_lenet():
    net, tnet, losses, tlosses, _ = _train_both(
        "lenet", optim.AdamW(lr=1e-3, weight_decay=0.1), lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1), 3)
    assert_same_trajectory(net, tnet, losses, tlosses)


@pytest.mark.parametrize("name", ["resnet", "densenet"])
def test_predict_matches_torch_eval_after_training(name):
    net, tnet, _, _, trainer = _run_sgd(name, nesterov=False, steps=3)
    x, _ = batch((5,) + NETS[name][1][1:], 99)     # another batch size: predict gets its own eval plan
    before = {k: np.array(v) for k, v in net.state_dict().items()}
    out = trainer.predict(x)
    tnet.eval()
    with torch.no_grad():
        tout = tnet(torch.from_numpy(x)).numpy()
    assert out.shape == tout.shape == (5, 10)
    assert rel_err(out, tout) < 1e-4
    # eval mode moved no statistics
    for k, v in net.state_dict().items():
        assert np.array_equal(v, before[k]), k


@pytest.mark.parametrize("hp", [dict(), dict(weight_decay=0.1), dict(momentum=0.5), dict(momentum=0.9, dampening=0.3),
                                dict(momentum=0.9, nesterov=True, weight_decay=1e-2)],
                         ids=["plain", "decay", "momentum", "dampening", "nesterov"])
def test_sgd_update_matches_torch_for_every_option(hp):
    """Four updates of one parameter, option by option: float64 agrees with torch.optim.SGD to
    rounding, and the CPU backend's fused kernel equals the array operations bit for bit."""
    _C = pytest.importorskip("minidnn._C")
    for dtype in (np.float64, np.float32):
        rng = np.random.default_rng(0)
        o = optim.SGD(lr=0.1, **hp)
        p0 = rng.standard_normal(5000).astype(dtype)
        params = {k: p0.copy() for k in ("arrays", "fused")}
        states = {k: [np.zeros_like(p0)] if o.momentum else [] for k in params}
        tp = torch.tensor(p0.copy(), requires_grad=True)
        to = torch.optim.SGD([tp], lr=0.1, **hp)
        ws = np.zeros(o.workspace(minidnn.graph.Spec(p0.shape, p0.dtype)), np.uint8)
        for t in range(1, 5):
            g = rng.standard_normal(5000).astype(dtype)
            o.update(params["arrays"], g, states["arrays"], ws, t)
            o.update(params["fused"], g, states["fused"], None, t, _C)
            tp.grad = torch.tensor(g)
            to.step()
        assert params["arrays"].tobytes() == params["fused"].tobytes(), dtype
        if dtype == np.float64:
            np.testing.assert_allclose(params["fused"], tp.detach().numpy(), rtol=1e-14, atol=1e-15)
