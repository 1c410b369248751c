"""Mixed precision against PyTorch's torch.autocast("cpu") and GradScaler (issue #27, CPU).

fp16: PyTorch 2.13's CPU build runs torch.autocast("cpu", dtype=torch.float16) and
torch.amp.GradScaler("cpu") (checked here), so the loss-scaling test compares with the real thing.

Tolerances. bfloat16 keeps 8 significant bits: eps = 2^-7, and round to nearest even errs by at
most u = eps/2 = 2^-8, relatively. Two correct bf16 implementations round the same values at the
same places, but their fp32 sums run in other orders, so an element near a rounding boundary may
round the other way; after that the runs differ by bf16's own error, not by fp32's. So the bound
is derived from bf16's intrinsic error on the very run compared, measured against the exact
(fp32) run: E = || torch_bf16 - torch_fp32 ||. If minidnn's bf16 run is a bf16 approximation as
good as PyTorch's up to a factor 3 (within 3E of fp32: asserted; measured up to 2.1, a
BatchNorm running mean of resnet20), the triangle inequality puts the two within 4E:

- every parameter and BatchNorm statistic after 20 steps:
  ||p_minidnn - p_torch|| <= 4 ||p_torch - p_torch_fp32|| + u ||p_torch||
  (u ||p||: one bf16 rounding of the parameter, the floor where E happens to vanish);
- the loss at step t: |l_minidnn - l_torch| <= 4 max_{s<=t} |l_torch(s) - l_fp32(s)| + sqrt(L) u |l_torch|
  (the error is a process: the largest deviation so far; sqrt(L) u: L rounding stages from the
  input to the loss, each differing by up to u independently, add up as a random walk);
- and minidnn's own distance from fp32 is within 3E + floor (it is not a much worse bf16).

Measured (resnet20): minidnn-torch, torch_bf16-fp32 and minidnn-fp32 are all alike (conv1.weight
0.098, 0.097, 0.098): what differs is bf16's doing. A sqrt(L) u sqrt(t) random-walk bound alone
is too tight for early layers: their weight gradients are sums with much cancellation, whose
rounding errors scale with the summands, not the sum.

The learning rate is small (lr = 0.001, momentum 0.9) so that the training is not chaotic on
these random batches: in fp32 the two frameworks then agree to fp32's own accumulation
differences after 20 steps (checked below, with its bound derived; at lr = 0.002 an AMD EPYC's
fp32 runs part at step 7, 1e-7 -> 7e-6, and grow tenfold a step to 1e-2), so what is measured
is the precision's doing, not an amplified butterfly.
"""
import math

import numpy as np
import pytest

import minidnn
from minidnn import nn as mnn
from minidnn import optim
from minidnn.precision import is_low
from networks import make_densenet, make_lenet, make_resnet20, make_vgg11_bn

torch = pytest.importorskip("torch")
from torch import nn as tnn  # noqa: E402

U_BF16 = 2.0 ** -8
STEPS, LR = 20, 0.001
NETS = {"resnet20": (make_resnet20, (8, 3, 16, 16)), "densenet": (make_densenet, (8, 3, 16, 16)),
        "vgg11_bn": (make_vgg11_bn, (8, 3, 32, 32))}


def batch(shape, step):
    rng = np.random.default_rng(1000 + step)
    x = rng.standard_normal(shape).astype(np.float32)
    y = (np.abs(x[:, 0]).mean(axis=(1, 2)) * 10).astype(np.int64) % 10     # a learnable labelling
    return x, y


def rounding_depth(graph) -> int:
    """L: the most low-precision values on one path from the input to the loss."""
    depth = {}
    for n in graph.nodes:
        d = max((depth.get(v.id, 0) for v in n.inputs), default=0)
        for o in n.outputs:
            depth[o.id] = d + (1 if is_low(o.dtype) else 0)
    return max(depth.values())


def train_both(name, precision):
    factory, shape = NETS[name]
    net = factory(mnn, minidnn.nn.functional.cat).init_parameters(0)
    tnet = factory(tnn, torch.cat)
    tnet.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    p0 = {k: np.array(v, np.float64) for k, v in net.state_dict().items()}
    trainer = minidnn.compile(net, shape, mnn.CrossEntropyLoss(), optim.SGD(lr=LR, momentum=0.9),
                              precision=precision, trace_every=0)
    topt = torch.optim.SGD(tnet.parameters(), lr=LR, momentum=0.9)
    losses = []
    for step in range(STEPS):
        x, y = batch(shape, step)
        loss = trainer.step(x, y)
        topt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            tloss = tnn.functional.cross_entropy(tnet(torch.from_numpy(x)), torch.from_numpy(y))
        tloss.backward()
        topt.step()
        losses.append((loss, tloss.item()))
    return trainer, net, tnet, p0, losses


@pytest.mark.parametrize("name", list(NETS))
def test_bf16_training_agrees_with_torch_autocast(name):
    trainer, net, tnet, p0, losses = train_both(name, "bf16")
    _, _, tnet32, _, losses32 = train_both(name, "fp32")
    sd = net.state_dict()
    for k, v in sd.items():                       # the master weights and statistics stay fp32
        assert np.asarray(v).dtype in (np.float32, np.int64), k
    big_l = rounding_depth(trainer.plan.schedule.graph)
    assert big_l >= 5
    worst = 0.0
    for t, ((ours, theirs), (_, exact)) in enumerate(zip(losses, losses32)):
        worst = max(worst, abs(theirs - exact))
        floor = math.sqrt(big_l) * U_BF16 * abs(theirs)
        assert abs(ours - theirs) <= 4 * worst + floor, (t, ours, theirs, exact)
        assert abs(ours - exact) <= 3 * worst + floor, (t, ours, theirs, exact)
    tsd, tsd32 = tnet.state_dict(), tnet32.state_dict()
    for k, v in sd.items():
        if k.endswith("num_batches_tracked"):
            assert int(np.asarray(v)) == int(tsd[k]) == STEPS, k
            continue
        ours, theirs, exact = np.asarray(v, np.float64), tsd[k].double().numpy(), tsd32[k].double().numpy()
        e, floor = np.linalg.norm(theirs - exact), U_BF16 * np.linalg.norm(theirs)
        assert np.linalg.norm(ours - exact) <= 3 * e + floor, (k, np.linalg.norm(ours - exact), e)
        assert np.linalg.norm(ours - theirs) <= 4 * e + floor, (k, np.linalg.norm(ours - theirs), e)
        assert np.linalg.norm(theirs - p0[k]) > 0 or k.endswith("running_var"), k    # training moved it


U_FP32 = 2.0 ** -24


def test_fp32_reference_run_is_not_chaotic():
    """The setting above in fp32: both frameworks agree to fp32's own accumulation differences, which
    grow at most linearly with the steps (no amplification). Their sums run in other orders (BLAS
    kernels differ by CPU): a sum of K terms in another order differs by about sqrt(K) u relatively
    (rounding errors adding as a random walk; K: the longest reduction, a weight gradient's or a
    BatchNorm statistic's over N H W at full resolution), and each step's update adds its own such
    difference, so the loss at step t is within (t + 1) sqrt(K) u of the other's. A chaotic setting
    amplifies the first difference geometrically and leaves that bound within a few steps."""
    _, net, tnet, _, losses = train_both("resnet20", "fp32")
    n, _, h, w = NETS["resnet20"][1]
    k = n * h * w
    for t, (ours, theirs) in enumerate(losses):
        assert abs(ours - theirs) <= (t + 1) * math.sqrt(k) * U_FP32 * abs(theirs), (t, ours, theirs)


FP16_SHAPE, FP16_STEPS, FORCED = (8, 1, 28, 28), 12, 7


def fp16_batch(step):
    """Step FORCED's batch is scaled by 300: its forward stays finite (logits ~30), but its first
    convolution's fp16 weight gradient (x times the scaled loss gradient) overflows fp16."""
    rng = np.random.default_rng(2000 + step)
    x = rng.standard_normal(FP16_SHAPE).astype(np.float32)
    return (x * 300 if step == FORCED else x), rng.integers(0, 10, FP16_SHAPE[0])


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # inf - inf in a skipped step
def test_fp16_skips_the_steps_torch_grad_scaler_skips_with_the_same_scales():
    """Init scale 2^24 (the scaled gradients overflow fp16 until the scale has halved six times),
    growth every 3 clean steps, and one forced overflow: minidnn's scaler and torch.amp.GradScaler("cpu")
    under torch.autocast("cpu", float16) skip the same steps, leave the weights there, and go through the
    same scales (powers of two: exact in both). No loss or weight tolerance is claimed here."""
    net = make_lenet(mnn).init_parameters(0)
    tnet = make_lenet(tnn)
    tnet.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    trainer = minidnn.compile(net, FP16_SHAPE, mnn.CrossEntropyLoss(), optim.SGD(lr=0.01, momentum=0.9),
                              precision="fp16", trace_every=0)
    trainer.scaler.scale, trainer.scaler.growth_interval = 2.0 ** 24, 3
    topt = torch.optim.SGD(tnet.parameters(), lr=0.01, momentum=0.9)
    tscaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 24, growth_interval=3)
    ours, theirs = [], []
    for step in range(FP16_STEPS):
        x, y = fp16_batch(step)
        before = {k: np.array(v.data) for k, v in net.named_parameters()}
        tbefore = {k: p.detach().clone() for k, p in tnet.named_parameters()}
        scale, skipped = trainer.scaler.scale, trainer.scaler.skipped_steps
        assert np.isfinite(trainer.step(x, y))
        skip = trainer.scaler.skipped_steps - skipped
        assert skip in (0, 1)
        moved = [not np.array_equal(v.data, before[k]) for k, v in net.named_parameters()]
        assert (not any(moved)) if skip else all(moved), step
        ours.append((scale, bool(skip)))

        topt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            tloss = tnn.functional.cross_entropy(tnet(torch.from_numpy(x)), torch.from_numpy(y))
        assert torch.isfinite(tloss)
        tscale = tscaler.get_scale()
        tscaler.scale(tloss).backward()
        tscaler.step(topt)
        tscaler.update()
        tmoved = [not torch.equal(p, tbefore[k]) for k, p in tnet.named_parameters()]
        assert not any(tmoved) or all(tmoved), step
        theirs.append((tscale, not any(tmoved)))
    assert ours == theirs
    skipped = [s for s, (_, sk) in enumerate(ours) if sk]
    assert skipped == [0, 1, 2, 3, 4, 5, FORCED]                     # what the setting above forces
    assert trainer.scaler.scale == tscaler.get_scale() == 2.0 ** 18       # backed off 7 times, grown once
    assert trainer.scaler.skipped_steps == len(skipped)
