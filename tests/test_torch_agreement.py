"""Whole-network agreement with PyTorch: losses, every gradient, optimizer trajectories, BN statistics.

Each network is written once as a class factory over a layer namespace
(``minidnn.nn`` or ``torch.nn``) and a ``cat`` function, so both frameworks get
exactly the same structure and the same state_dict names. Weights are made by
minidnn and copied into torch through the state_dict.
"""

import numpy as np
import pytest

import minidnn
from harness import host
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


# -- the networks, written once over a layer namespace --------------------------------------------

def make_lenet(nn, cat):
    class LeNet5(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 6, kernel_size=5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(6, 16, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2))
            self.flatten = nn.Flatten()
            self.classifier = nn.Sequential(
                nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))

        def forward(self, x):
            return self.classifier(self.flatten(self.features(x)))

    return LeNet5()


def make_resnet(nn, cat):
    class BasicBlock(nn.Module):
        def __init__(self, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU()
            self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x):
            identity = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            if self.downsample is not None:
                identity = self.downsample(x)
            return self.relu(out + identity)

    class SmallResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.relu = nn.ReLU()
            self.layer1 = nn.Sequential(BasicBlock(8, 8))
            self.layer2 = nn.Sequential(BasicBlock(8, 16, stride=2, downsample=nn.Sequential(
                nn.Conv2d(8, 16, 1, stride=2, bias=False), nn.BatchNorm2d(16))))
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.flatten = nn.Flatten()
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            x = self.relu(self.bn1(self.conv1(x)))
            x = self.layer2(self.layer1(x))
            return self.fc(self.flatten(self.avgpool(x)))

    return SmallResNet()


def make_densenet(nn, cat):
    class DenseLayer(nn.Module):
        def __init__(self, cin, growth):
            super().__init__()
            self.norm = nn.BatchNorm2d(cin)
            self.relu = nn.ReLU()
            self.conv = nn.Conv2d(cin, growth, 3, padding=1, bias=False)

        def forward(self, x):
            return cat([x, self.conv(self.relu(self.norm(x)))], 1)

    class SmallDenseNet(nn.Module):
        def __init__(self, c0=8, growth=4, layers=3):
            super().__init__()
            self.conv0 = nn.Conv2d(3, c0, 3, padding=1, bias=False)  # a bias before BN gets zero gradient
            self.block = nn.Sequential(*[DenseLayer(c0 + i * growth, growth) for i in range(layers)])
            c = c0 + layers * growth
            self.transition = nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1),
                                            nn.AvgPool2d(2))
            self.flatten = nn.Flatten()
            self.fc = nn.Linear(c // 2 * 8 * 8, 10)

        def forward(self, x):
            return self.fc(self.flatten(self.transition(self.block(self.conv0(x)))))

    return SmallDenseNet()


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


def _run_sgd(name, nesterov, steps=5, device="cpu"):
    net, tnet, shape = build_pair(name)
    hp = dict(lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=nesterov)
    trainer = minidnn.compile(net, shape, mnn.CrossEntropyLoss(), optimizer=optim.SGD(**hp), device=device,
                              memory=minidnn.MemoryConfig(check=True, poison=True))
    topt = torch.optim.SGD(tnet.parameters(), **hp)
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


@pytest.mark.parametrize("nesterov", [False, True], ids=["momentum", "nesterov"])
@pytest.mark.parametrize("name", list(NETS))
def test_sgd_trajectory(name, nesterov, device):
    net, tnet, losses, tlosses, _ = _run_sgd(name, nesterov, device=device)
    for s, (a, b) in enumerate(zip(losses, tlosses)):
        assert abs(a - b) <= 1e-4 * abs(b), (s, a, b)
    # the weights actually moved, so agreement of the final parameters means something
    init, _, _ = build_pair(name)
    moved = max(rel_err(p.data, init_p.data) for (_, p), (_, init_p)
                in zip(net.named_parameters(), init.named_parameters()))
    assert moved > 1e-3
    tparams = dict(tnet.named_parameters())
    for n, p in net.named_parameters():
        assert rel_err(p.data, tparams[n].detach().numpy()) < 1e-4, n
    assert_buffers_match(net, tnet, 1e-4)


def test_adam_resnet(device):
    net, tnet, shape = build_pair("resnet")
    trainer = minidnn.compile(net, shape, mnn.CrossEntropyLoss(), device=device,
                              optimizer=optim.Adam(lr=1e-3, weight_decay=1e-4),
                              memory=minidnn.MemoryConfig(check=True, poison=True))
    topt = torch.optim.Adam(tnet.parameters(), lr=1e-3, weight_decay=1e-4)
    for s in range(5):
        x, y = batch(shape, s)
        loss = trainer.step(x, y)
        topt.zero_grad()
        tl = torch_loss(tnet, x, y)
        tl.backward()
        topt.step()
        assert abs(loss - tl.item()) <= 1e-4 * abs(tl.item()), s
    tparams = dict(tnet.named_parameters())
    for n, p in net.named_parameters():
        assert rel_err(p.data, tparams[n].detach().numpy()) < 1e-4, n
    assert_buffers_match(net, tnet, 1e-4)


def test_adamw_lenet():
    net, tnet, shape = build_pair("lenet")
    trainer = minidnn.compile(net, shape, mnn.CrossEntropyLoss(), optimizer=optim.AdamW(lr=1e-3, weight_decay=0.1))
    topt = torch.optim.AdamW(tnet.parameters(), lr=1e-3, weight_decay=0.1)
    for s in range(3):
        x, y = batch(shape, s)
        loss = trainer.step(x, y)
        topt.zero_grad()
        tl = torch_loss(tnet, x, y)
        tl.backward()
        topt.step()
        assert abs(loss - tl.item()) <= 1e-4 * abs(tl.item()), s
    tparams = dict(tnet.named_parameters())
    for n, p in net.named_parameters():
        assert rel_err(p.data, tparams[n].detach().numpy()) < 1e-4, n


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
