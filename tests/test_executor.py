"""The executor and its accounting: plan figures, measured peaks, poison mode, per-shape plans,
reproducibility, eval mode, and the persistent region."""

import numpy as np
import pytest

import minidnn
from harness import host
from minidnn import nn, optim
from minidnn.schedule import aligned
from networks import make_lenet, make_resnet


NETS = {"lenet": (make_lenet, (8, 1, 28, 28)), "resnet": (make_resnet, (8, 3, 16, 16))}


def batch(shape, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0])


def trainer_for(name, optimizer=None, memory=None, init=0, dropout=False, shape=None, **kw):
    """A trainer for a fresh net with weights from ``init``; ``kw`` go to compile (``seed``, ``dtype``)."""
    factory, default = NETS[name]
    net = factory(nn, dropout=dropout).init_parameters(init)
    if optimizer is None:
        optimizer = optim.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4)
    return minidnn.compile(net, shape or default, nn.CrossEntropyLoss(), optimizer, memory=memory, **kw)


def run_steps(trainer, shape, n=3, first_seed=0):
    return [trainer.step(*batch(shape, first_seed + s)) for s in range(n)]


def assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert np.array_equal(host(sa[k]), host(sb[k])), k


# -- the plan's figures ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(NETS))
def test_plan_accounting(name):
    trainer = trainer_for(name)
    plan = trainer.plan
    sched = plan.schedule
    persistent = sum(aligned(t.nbytes) for t in sched.tensors if t.persistent)
    assert plan.persistent_bytes == persistent == trainer.persistent_bytes
    # ideal: every arena tensor of the iteration resident at once
    arena_tensors = [t for t in sched.tensors if not t.persistent]
    assert plan.ideal_bytes == persistent + sum(aligned(t.nbytes) for t in arena_tensors)
    # liveness peak: recomputed here from the buffers' lifetimes
    live = np.zeros(len(plan.steps), np.int64)
    for k, (a, b) in plan.spans.items():
        live[a:b + 1] += aligned(plan.sizes[k])
    assert plan.liveness_peak_bytes == persistent + live.max()
    assert plan.ideal_bytes >= plan.liveness_peak_bytes
    assert plan.liveness_peak_bytes <= plan.peak_bytes == persistent + plan.arena_bytes
    assert plan.ideal_bytes > plan.liveness_peak_bytes          # reuse actually happened
    assert plan.fragmentation_bytes >= 0
    assert plan.fragmentation_bytes == plan.arena_bytes - live.max()
    assert trainer.ideal_bytes == plan.ideal_bytes
    assert trainer.liveness_peak_bytes == plan.liveness_peak_bytes
    text = plan.summary()
    assert str(plan.peak_bytes) in text and str(plan.liveness_peak_bytes) in text


@pytest.mark.parametrize("name", list(NETS))
def test_measured_peak_equals_plan_peak(name, device):
    trainer = trainer_for(name, memory=minidnn.MemoryConfig(check=True), device=device)
    shape = NETS[name][1]
    trainer.step(*batch(shape, 0))
    assert trainer.executor.high_water_bytes == trainer.plan.arena_bytes
    assert trainer.measured_peak_bytes == trainer.plan.peak_bytes
    # the executor held exactly one arena of the plan's size
    assert trainer.executor.arena.nbytes == trainer.plan.arena_bytes


@pytest.mark.parametrize("name,dropout,opt", [("lenet", False, "sgd"), ("resnet", False, "sgd"),
                                               ("resnet", True, "adam")])
def test_budgeted_runs_are_bitwise_identical_to_unlimited(name, dropout, opt, device):
    """Offload, prefetch and recompute never change a result, and the measured peak is the plan's."""
    shape = NETS[name][1]

    def make(memory=None):
        o = optim.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4) if opt == "sgd" else optim.Adam(lr=1e-3)
        return trainer_for(name, optimizer=o, memory=memory, dropout=dropout, seed=4, device=device)

    with pytest.raises(minidnn.MemoryBudgetError) as e:
        make(memory=minidnn.MemoryConfig(budget=1, algorithms="default", sub_batching=False))
    minimum = e.value.minimum_bytes
    free = make(minidnn.MemoryConfig(algorithms="default"))
    ref = run_steps(free, shape)
    peak = free.plan.peak_bytes
    assert minimum < peak
    for budget in (minimum, (minimum + peak) // 2):
        t = make(minidnn.MemoryConfig(budget=budget, check=True, poison=True, algorithms="default"))
        assert t.plan.peak_bytes <= budget
        kinds = {s.kind for s in t.plan.steps}
        assert kinds & {"offload", "recompute"}, "a budget below the peak must evict something"
        assert run_steps(t, shape) == ref
        assert_same_state(t.net, free.net)
        assert t.measured_peak_bytes == t.plan.peak_bytes <= budget


# -- poison mode ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(NETS))
def test_poison_mode_is_bitwise_identical(name, device):
    shape = NETS[name][1]
    plain = trainer_for(name, memory=minidnn.MemoryConfig(poison=False), device=device)
    poisoned = trainer_for(name, memory=minidnn.MemoryConfig(poison=True, check=True), device=device)
    assert run_steps(plain, shape) == run_steps(poisoned, shape)
    assert_same_state(plain.net, poisoned.net)
    for (n, p), (_, q) in zip(plain.net.named_parameters(), poisoned.net.named_parameters()):
        assert np.array_equal(host(p.grad), host(q.grad)), n
    # poison really fills the arena: after a step every freed byte is 0xFF
    assert (host(poisoned.executor.arena) == 0xFF).mean() > 0.5


# -- a plan per input shape -----------------------------------------------------------------------

def test_partial_batch_gets_its_own_cached_plan():
    shape = NETS["resnet"][1]
    small = (5,) + shape[1:]
    trainer = trainer_for("resnet", optimizer=optim.SGD(lr=0.05), memory=minidnn.MemoryConfig(check=True))
    p5 = trainer.plan_for(small)
    assert trainer.plan_for(small) is p5
    assert p5 is not trainer.plan and trainer.plan_for(shape) is trainer.plan
    assert p5.schedule.inputs and p5.schedule.tensor(p5.schedule.inputs[0]).spec.shape == small
    assert p5.arena_bytes < trainer.plan.arena_bytes
    assert p5.persistent_bytes == trainer.plan.persistent_bytes

    # the partial batch first (the arena grows afterwards), then a full one
    xs, ys = batch(small, 10)
    xf, yf = batch(shape, 11)
    l5 = trainer.step(xs, ys)
    assert trainer.plan_for(small) is p5
    assert trainer.executor.high_water_bytes == p5.arena_bytes
    assert trainer.measured_peak_bytes == p5.peak_bytes
    l8 = trainer.step(xf, yf)
    assert trainer.measured_peak_bytes == trainer.plan.peak_bytes

    # the same two steps by trainers compiled at each shape (plain SGD: the weights are the state)
    t5 = trainer_for("resnet", optimizer=optim.SGD(lr=0.05), shape=small)
    assert t5.step(xs, ys) == l5
    t8 = trainer_for("resnet", optimizer=optim.SGD(lr=0.05))
    t8.net.load_state_dict(t5.net.state_dict())
    assert t8.step(xf, yf) == l8
    assert_same_state(trainer.net, t8.net)

    # a predict() on a batch larger than any so far (the arena grows and every plan is bound anew)
    # changes nothing for the training steps that follow
    trainer.predict(batch((32,) + shape[1:], 12)[0])
    assert trainer.executor.arena.nbytes >= trainer.plan_for((32,) + shape[1:], training=False).arena_bytes
    assert trainer.step(xf, yf) == t8.step(xf, yf)
    assert_same_state(trainer.net, t8.net)

    # and it keeps training: the partial batch's loss goes down
    losses = [trainer.step(xs, ys) for _ in range(4)]
    assert losses[-1] < losses[0]


def test_eval_plans_are_cached_per_shape():
    trainer = trainer_for("lenet")
    e4 = trainer.plan_for((4, 1, 28, 28), training=False)
    assert trainer.plan_for((4, 1, 28, 28), training=False) is e4
    assert e4 is not trainer.plan_for((4, 1, 28, 28))
    assert e4.schedule.loss is None
    assert not any(s.kind in ("backward", "update") for s in e4.steps)


# -- reproducibility ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(NETS))
def test_seeded_runs_repeat_bit_for_bit(name, device):
    shape = NETS[name][1]
    a = trainer_for(name, dropout=True, init=3, seed=5, device=device)
    b = trainer_for(name, dropout=True, init=3, seed=5, device=device)
    la = run_steps(a, shape)
    assert la == run_steps(b, shape)
    assert_same_state(a.net, b.net)
    for (n, p), (_, q) in zip(a.net.named_parameters(), b.net.named_parameters()):
        assert np.array_equal(host(p.grad), host(q.grad)), n
    # the trainer's seed drives dropout: another seed gives other losses from the same weights
    c = trainer_for(name, dropout=True, init=3, seed=6, device=device)
    assert run_steps(c, shape) != la


# -- eval mode ------------------------------------------------------------------------------------

def _numpy_eval(sd, x):
    """conv 3x3 -> BN (running stats) -> ReLU -> global average -> Linear, in float64."""
    from numpy.lib.stride_tricks import sliding_window_view
    w, b = sd["conv.weight"].astype(np.float64), sd["conv.bias"].astype(np.float64)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    h = np.einsum("nchwij,ocij->nohw", sliding_window_view(xp, (3, 3), axis=(2, 3)), w) + b[None, :, None, None]
    c = lambda v: v.astype(np.float64)[None, :, None, None]  # noqa: E731
    h = (h - c(sd["bn.running_mean"])) / np.sqrt(c(sd["bn.running_var"]) + 1e-5) * c(sd["bn.weight"]) \
        + c(sd["bn.bias"])
    h = np.maximum(h, 0).mean(axis=(2, 3))
    return h @ sd["fc.weight"].astype(np.float64).T + sd["fc.bias"]


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.flat = nn.Flatten()
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(6, 10)

    def forward(self, x):
        return self.fc(self.drop(self.flat(self.pool(self.relu(self.bn(self.conv(x)))))))


def test_predict_uses_running_statistics():
    net = ConvBN().init_parameters(0)
    trainer = minidnn.compile(net, (8, 3, 6, 6), nn.CrossEntropyLoss(), optim.SGD(lr=0.1, momentum=0.9))
    for s in range(3):
        x, y = batch((8, 3, 6, 6), s)
        trainer.step(x * 3 + 1, y)                  # statistics far from (0, 1)
    sd = {k: np.array(v) for k, v in net.state_dict().items()}
    assert np.abs(sd["bn.running_mean"]).max() > 0.1
    assert int(sd["bn.num_batches_tracked"]) == 3
    x, _ = batch((5, 3, 6, 6), 50)
    out = trainer.predict(x)
    assert out.shape == (5, 10) and out.dtype == np.float32
    ref = _numpy_eval(sd, x)
    assert np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max()
    # batch statistics would give something else: the test can tell the two apart
    sd_batch = dict(sd, **{"bn.running_mean": np.zeros(6), "bn.running_var": np.ones(6)})
    assert np.abs(_numpy_eval(sd_batch, x) - ref).max() > 1e-2
    # eval is deterministic (no dropout) and leaves every parameter and buffer as it was
    assert np.array_equal(trainer.predict(x), out)
    for k, v in net.state_dict().items():
        assert np.array_equal(v, sd[k]), k
    assert net.training                            # predict restores the module's mode
    # the result is the caller's own array, not a view of the arena the next run overwrites
    assert not np.shares_memory(out, trainer.executor.arena)
    kept = out.copy()
    trainer.step(*batch((8, 3, 6, 6), 9))
    trainer.predict(batch((5, 3, 6, 6), 51)[0])
    assert np.array_equal(out, kept)


def test_batchnorm_counter_moves_with_the_statistics_after_net_eval():
    net = ConvBN().init_parameters(0)
    net.eval()
    trainer = minidnn.compile(net, (8, 3, 6, 6), nn.CrossEntropyLoss(), optim.SGD(lr=0.1))
    before = np.array(net.bn.running_mean.data)
    trainer.step(*batch((8, 3, 6, 6), 0))
    moved = not np.array_equal(net.bn.running_mean.data, before)
    assert int(net.bn.num_batches_tracked.data) == (1 if moved else 0)


def test_predict_matches_torch_eval():
    torch = pytest.importorskip("torch")
    trainer = trainer_for("resnet", dropout=True)
    shape = NETS["resnet"][1]
    run_steps(trainer, shape)
    tnet = make_resnet(torch.nn, dropout=True)
    tnet.load_state_dict({k: torch.from_numpy(np.array(v)).reshape(tnet.state_dict()[k].shape)
                          for k, v in trainer.net.state_dict().items()})
    tnet.eval()
    x, _ = batch((3,) + shape[1:], 77)
    with torch.no_grad():
        ref = tnet(torch.from_numpy(x)).numpy()
    out = trainer.predict(x)
    assert np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max()


# -- the persistent region ------------------------------------------------------------------------

@pytest.mark.parametrize("opt,n_states", [(None, 0), (optim.SGD(lr=0.1), 0), (optim.SGD(lr=0.1, momentum=0.9), 1),
                                          (optim.Adam(), 2)], ids=["grads-only", "sgd", "momentum", "adam"])
@pytest.mark.parametrize("name", list(NETS))
def test_persistent_region(name, opt, n_states):
    net = NETS[name][0](nn).init_parameters(0)
    expected = net.state_dict()
    expected = {k: np.array(v) for k, v in expected.items()}
    trainer = minidnn.compile(net, NETS[name][1], nn.CrossEntropyLoss(), opt)
    region = trainer.store.region
    views = []
    for n, p in net.named_parameters():
        assert np.shares_memory(p.data, region), n
        assert np.shares_memory(p.grad, region), n
        assert np.array_equal(p.data, expected[n]), n       # moved in unchanged
        assert not np.any(p.grad)
        views += [p.data, p.grad]
    for n, b in net.named_buffers():
        if "running" in n:
            assert np.shares_memory(b.data, region), n
            views.append(b.data)
    for k, v in net.state_dict().items():
        if not k.endswith("num_batches_tracked"):
            assert np.shares_memory(v, region), k
    # no two persistent arrays share a byte
    bounds = sorted((v.__array_interface__["data"][0], v.nbytes) for v in views)
    for (a, na), (b, _) in zip(bounds, bounds[1:]):
        assert a + na <= b

    params = sum(aligned(p.data.nbytes) for p in net.parameters())
    running = sum(aligned(b.data.nbytes) for n, b in net.named_buffers() if "running" in n)
    assert trainer.persistent_bytes == params * (2 + n_states) + running
    assert trainer.persistent_bytes == trainer.plan.persistent_bytes == region.nbytes
    # a step writes the gradients where p.grad points
    trainer.step(*batch(NETS[name][1], 0))
    assert all(np.any(p.grad) for p in net.parameters())
    assert all(np.shares_memory(p.data, region) for p in net.parameters())
