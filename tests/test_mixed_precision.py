"""Mixed precision on the CPU backend (issue #27): the policy, the graph's casts, the staged
kernels' error bounds, exact bytes, budgets, fp16 loss scaling, checkpoints and the command line.

Error bounds of a staged op (ops/staging.py): its low-precision inputs are converted to fp32
exactly, the op's fp32 kernel runs, and each result is rounded once to the low dtype. Against
the same fp32 kernel on the same (already low-precision) inputs, an output element therefore
differs by at most u_low |y| (one round to nearest even: u = eps/2, bf16 2^-8, fp16 2^-11) plus
the fp32 accumulation's own difference, which is zero here (the same kernel, the same order).
Against fp32 inputs that were *not* rounded first, a sum of K products x_i w_i adds
2 u_low sum |x_i w_i| (each factor rounded once): bound = u_low |y| + 2 u_low K max|x| max|w|.
"""
import numpy as np
import pytest

import minidnn as mdn
from harness import run_op
from minidnn import nn, optim
from minidnn.errors import CheckpointError, ConfigError
from minidnn.ops.conv import Conv2dOp
from minidnn.ops.linear import LinearOp
from minidnn.ops.norm import BatchNorm2dOp
from minidnn.ops.staging import staged
from minidnn.precision import BF16, FP16, eps, get_precision, is_low
from minidnn.schedule import ACT, ACT_GRAD, OPT_STATE, PARAM, PARAM_GRAD

U = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
LOW = {"bf16": BF16, "fp16": FP16}


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        y = nn.relu(self.bn(self.conv(x)))
        y = y + y
        return self.fc(nn.flatten(nn.functional.adaptive_avg_pool2d(y)))


def data(step, shape=(4, 3, 8, 8)):
    rng = np.random.default_rng(step)
    return rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0])


def trainer(precision, memory=None, seed=0, lr=0.1):
    return mdn.compile(Small().init_parameters(seed=seed), (4, 3, 8, 8), nn.CrossEntropyLoss(),
                       optim.SGD(lr=lr, momentum=0.9), precision=precision, memory=memory)


# -- the policy ------------------------------------------------------------------------------
def test_precision_names_and_epsilons():
    assert eps(BF16) == 2.0 ** -7 and eps(FP16) == 2.0 ** -10
    assert get_precision("bf16").low == BF16 and not get_precision("bf16").scaled
    assert get_precision("fp16").scaled and not get_precision("tf32").mixed
    with pytest.raises(ConfigError, match="unknown precision 'fp8': use one of"):
        get_precision("fp8")


def test_bad_precision_and_dtype_are_refused_in_one_line_leaving_the_net():
    net = Small().init_parameters(seed=0)
    before = {k: np.array(v) for k, v in net.state_dict().items()}
    with pytest.raises(ConfigError, match="unknown precision") as e:
        mdn.compile(net, (4, 3, 8, 8), nn.CrossEntropyLoss(), optim.SGD(lr=0.1), precision="half")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="float32 master weights"):
        mdn.compile(net, (4, 3, 8, 8), nn.CrossEntropyLoss(), optim.SGD(lr=0.1), precision="bf16", dtype=np.float64)
    for k, v in net.state_dict().items():
        assert np.array_equal(np.asarray(v), before[k]) and np.asarray(v).dtype == before[k].dtype


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_graph_traced_for_native_kernels_stages_only_the_others(precision):
    """Traced for the CPU backend (no native low-precision kernels) every op that reads the low dtype
    is staged through fp32; traced for the CUDA backend's kernels (its NATIVE_OPS) those ops keep
    their own class and read the low dtype, and only the others are staged. The casts are the same."""
    from minidnn.backend.cuda.precision import NATIVE_OPS
    from minidnn.graph import trace
    from minidnn.ops.staging import Staged
    cpu = trace(Small(), (4, 3, 8, 8), loss=nn.CrossEntropyLoss(), precision=precision)
    gpu = trace(Small(), (4, 3, 8, 8), loss=nn.CrossEntropyLoss(), precision=precision, native=NATIVE_OPS)
    assert [n.op.name for n in cpu.nodes] == [n.op.name for n in gpu.nodes]
    reads_low = [any(is_low(v.dtype) for v in n.inputs) for n in cpu.nodes]
    staged_cpu = {n.op.name for n, low in zip(cpu.nodes, reads_low) if low and isinstance(n.op, Staged)}
    staged_gpu = {n.op.name for n, low in zip(gpu.nodes, reads_low) if low and isinstance(n.op, Staged)}
    assert {"conv2d", "batch_norm2d", "relu", "add", "linear"} <= staged_cpu
    assert staged_gpu == staged_cpu - NATIVE_OPS
    assert all(not isinstance(n.op, Staged) for n in gpu.nodes if n.op.name in NATIVE_OPS)


# -- the graph's casts and the bytes -----------------------------------------------------------
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_master_weights_fp32_activations_low_casts_planned(precision):
    tr = trainer(precision)
    sched = tr.plan.schedule
    low = LOW[precision]
    by_cat = {}
    for t in sched.tensors:
        by_cat.setdefault(t.category, set()).add(np.dtype(t.spec.dtype))
        assert t.nbytes == int(np.prod(t.spec.shape)) * np.dtype(t.spec.dtype).itemsize    # each at its own size
    for cat in (PARAM, PARAM_GRAD, OPT_STATE):      # (BatchNorm's running statistics are parameters' too)
        assert by_cat[cat] == {np.dtype(np.float32)}, cat
    assert low in by_cat[ACT] and low in by_cat[ACT_GRAD]
    labels = {t.name: np.dtype(t.spec.dtype) for t in sched.tensors}
    assert labels["conv:cast_" + low.name] == low                        # the weight's low copy: a planned tensor
    assert sched.tensor(sched.loss).spec.dtype == np.float32                # the loss in fp32
    bn = next(n for n in sched.graph.nodes if n.op.name == "batch_norm2d")
    assert bn.outputs[0].dtype == low and bn.outputs[1].dtype == bn.outputs[2].dtype == np.float32
    assert "precision " + precision in tr.plan.summary()
    # persistent region: exactly fp32's (master weights, gradients, optimizer state, statistics)
    assert tr.plan.persistent_bytes == trainer("fp32").plan.persistent_bytes


def test_fp32_and_tf32_trace_the_same_graph_as_before():
    a, b = trainer("fp32"), trainer("tf32")
    assert [t.spec for t in a.plan.schedule.tensors] == [t.spec for t in b.plan.schedule.tensors]
    assert "precision" not in a.plan.summary() and "precision tf32" in b.plan.summary()
    x, y = data(0)
    assert a.step(x, y) == b.step(x, y)


def test_resnet50_b256_memory_bf16_vs_fp32():
    """`minidnn plan --model resnet50 --batch-size 256 [--precision bf16]` on a GPU's profile: every
    tensor counted at its own dtype's bytes, the master weights' persistent region unchanged, and
    the liveness peak and the arena in bf16 at most 0.55 of fp32's."""
    from minidnn.report import make_plan
    from minidnn.schedule import aligned
    p32, _ = make_plan("resnet50", 256, precision="fp32")
    p16, _ = make_plan("resnet50", 256, precision="bf16")
    sched = p16.schedule
    for t in sched.tensors:
        assert sched.tensor_bytes[t.id] == aligned(int(np.prod(t.spec.shape)) * np.dtype(t.spec.dtype).itemsize), t.name
    relus = [t for t in sched.tensors if t.category == "activation" and t.name.endswith(":relu")]
    assert len(relus) >= 49 and all(t.spec.dtype == BF16 for t in relus)
    assert p16.persistent_bytes == p32.persistent_bytes
    assert p16.liveness_peak_bytes <= 0.55 * p32.liveness_peak_bytes
    assert p16.arena_bytes <= 0.55 * p32.arena_bytes


# -- the staged kernels ------------------------------------------------------------------------
CASES = {
    "conv2d": (lambda: Conv2dOp(padding=1), lambda r: [r.standard_normal((2, 4, 5, 5)),
                                                      r.standard_normal((3, 4, 3, 3)) * 0.3], 4 * 9),
    "linear": (LinearOp, lambda r: [r.standard_normal((4, 16)), r.standard_normal((5, 16)) * 0.3], 16),
}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("name", list(CASES))
def test_staged_op_forward_and_gradients_within_one_rounding_of_fp32(name, precision):
    make, inputs, k = CASES[name]
    low, u = LOW[precision], U[precision]
    r = np.random.default_rng(1)
    xs = [a.astype(np.float32).astype(low) for a in inputs(r)]           # the op's low inputs
    wide = [a.astype(np.float32) for a in xs]                            # the same values in fp32
    gy = None
    (y32,), _ = run_op(make(), wide)
    gy = r.standard_normal(y32.shape).astype(np.float32).astype(low)
    (y32,), g32 = run_op(make(), wide, gy.astype(np.float32))
    (ylow,), glow = run_op(staged(make()), xs, gy)
    assert ylow.dtype == low and all(g.dtype == low for g in glow if g is not None)
    # forward: the fp32 result rounded once (round to nearest even): |err| <= u |y|, and it is exactly that
    assert np.array_equal(ylow, y32.astype(low))
    assert np.all(np.abs(ylow.astype(np.float64) - y32) <= u * np.abs(y32))
    for a, b in zip(glow, g32):
        if a is not None:
            assert np.array_equal(a, b.astype(low))
            assert np.all(np.abs(a.astype(np.float64) - b) <= u * np.abs(b))
    # against unrounded fp32 inputs: + 2u per product, over the reduction length k
    raw = [a.astype(np.float32) for a in inputs(np.random.default_rng(1))]
    (yraw,), _ = run_op(make(), raw)
    bound = u * np.abs(yraw) + 2 * u * k * np.abs(raw[0]).max() * np.abs(raw[1]).max()
    assert np.all(np.abs(ylow.astype(np.float64) - yraw) <= bound)


def test_staged_batchnorm_keeps_fp32_statistics():
    r = np.random.default_rng(2)
    x = r.standard_normal((4, 3, 5, 5)).astype(np.float32)
    params = [np.ones(3, np.float32), np.zeros(3, np.float32), np.zeros(3, np.float32), np.ones(3, np.float32)]
    p2 = [p.copy() for p in params]
    (y32, m32, s32), _ = run_op(BatchNorm2dOp(), [x.astype(BF16).astype(np.float32)] + params)
    (ylow, mlow, slow), _ = run_op(staged(BatchNorm2dOp()), [x.astype(BF16)] + p2)
    assert mlow.dtype == slow.dtype == np.float32 and ylow.dtype == BF16
    assert np.array_equal(mlow, m32) and np.array_equal(slow, s32) and np.array_equal(ylow, y32.astype(BF16))
    assert np.array_equal(p2[2], params[2]) and np.array_equal(p2[3], params[3])   # running stats alike


# -- budgets, poison, checkpoints ------------------------------------------------------------
def test_bf16_under_a_budget_is_bitwise_the_unlimited_run_poison_on():
    free = trainer("bf16", mdn.MemoryConfig(poison=True, check=True, algorithms="default", sub_batching=False))
    try:
        trainer("bf16", mdn.MemoryConfig(budget=1 << 10, algorithms="default", sub_batching=False))
    except mdn.errors.MemoryBudgetError as e:
        least = e.minimum_bytes
    tight = trainer("bf16", mdn.MemoryConfig(budget=least, poison=True, check=True, algorithms="default",
                                            sub_batching=False))
    assert tight.plan.peak_bytes <= least <= free.plan.peak_bytes
    for step in range(3):
        x, y = data(step)
        assert free.step(x, y) == tight.step(x, y)
        assert tight.measured_peak_bytes == tight.plan.peak_bytes
    for (k, a), b in zip(free.net.state_dict().items(), tight.net.state_dict().values()):
        assert np.array_equal(np.asarray(a), np.asarray(b)), k


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_checkpoint_keeps_fp32_master_weights_names_precision_and_resumes_exactly(precision, tmp_path):
    a = trainer(precision)
    for step in range(2):
        a.step(*data(step))
    path = str(tmp_path / "ck.safetensors")
    mdn.save(path, a)
    from minidnn.training import read_checkpoint
    ck = read_checkpoint(path)
    assert ck.meta["precision"] == precision
    assert all(t.dtype == np.float32 for k, t in ck.tensors.items() if not k.endswith("num_batches_tracked"))
    if precision == "fp16":
        assert ck.meta["grad_scaler"]["scale"] == a.scaler.scale
    b = mdn.load(path, trainer(precision, seed=5))
    if precision == "fp16":
        assert b.scaler.state_dict() == a.scaler.state_dict()
    for step in range(2, 4):
        assert a.step(*data(step)) == b.step(*data(step))
    with pytest.raises(CheckpointError, match=f"trained in precision {precision}, this trainer is fp32"):
        mdn.load(path, trainer("fp32"))
    mdn.load(path, trainer("fp32"), precision_change=True)             # on purpose


# -- fp16 loss scaling ------------------------------------------------------------------------
def test_fp16_grad_scaler_skips_overflowing_steps_and_backs_off():
    tr = trainer("fp16")
    assert tr.scaler.scale == 2.0 ** 16 and tr.scaler.growth_interval == 2000
    tr.scaler.scale = 2.0 ** 40                                      # forced: the scaled gradients overflow fp16
    before = {k: np.array(v) for k, v in tr.net.state_dict().items()}
    x, y = data(0)
    scales = []
    while True:
        scales.append(tr.scaler.scale)
        skipped = tr.scaler.skipped_steps
        tr.step(x, y)
        if tr.scaler.skipped_steps == skipped:
            break
        for k, v in tr.net.state_dict().items():                     # a skipped step leaves the weights
            if "running" not in k and "num_batches" not in k:
                assert np.array_equal(np.asarray(v), before[k]), k
    assert len(scales) >= 2 and scales == [2.0 ** 40 * 0.5 ** i for i in range(len(scales))]
    assert tr.scaler.skipped_steps == len(scales) - 1 and tr.scaler.growth_tracker == 1
    assert not np.array_equal(np.asarray(tr.net.state_dict()["conv.weight"]), before["conv.weight"])


def test_fp16_growth_after_interval_and_refusal_at_the_minimum():
    tr = trainer("fp16")
    tr.scaler.growth_interval = 2
    for step in range(2):
        tr.step(*data(step))
    assert tr.scaler.scale == 2.0 ** 17 and tr.scaler.growth_tracker == 0
    tr.scaler.scale, tr.scaler.min_scale = 2.0 ** 40, 2.0 ** 40    # one backoff would go below it
    steps = tr.steps_done
    with pytest.raises(mdn.errors.NumericalError, match="fall below its minimum.*precision='bf16'"):
        tr.step(*data(5))
    assert tr.steps_done == steps and tr.scaler.scale == 2.0 ** 40     # nothing changed


def test_bf16_splits_into_sub_batches_with_each_weight_cast_once():
    """Below the unsplit minimum, a bf16 step runs as sub-batches with full-batch BatchNorm: the weights'
    low copies read no sample, so the split graph casts each weight once for every sub-batch, and the
    split step's loss is the unsplit one's up to rounding: each value on the loss's path is rounded
    to bf16 at most once per node (u = 2^-8 relative each), and a path has at most as many nodes as
    the graph, so to first order the two differ by at most (nodes) * u relative."""
    from minidnn.graph import trace
    from minidnn.memory.subbatch import StagedPlan
    from minidnn.split_graph import split_graph
    graph = trace(Small(), (2, 3, 8, 8), loss=nn.CrossEntropyLoss(), precision="bf16")
    split = split_graph(graph, 2)
    weight_casts = lambda g: [n for n in g.nodes if n.op.name.startswith("cast")  # noqa: E731
                              and all(v.kind == "param" for v in n.inputs)]
    assert len(weight_casts(split)) == len(weight_casts(graph)) >= 3
    with pytest.raises(mdn.errors.MemoryBudgetError) as e:
        trainer("bf16", mdn.MemoryConfig(budget=1 << 10, sub_batching=False))
    split_trainer = trainer("bf16", mdn.MemoryConfig(budget=e.value.minimum_bytes - 1, check=True, poison=True))
    whole = trainer("bf16")
    assert isinstance(split_trainer.plan, StagedPlan) and split_trainer.plan.k >= 2
    x, y = data(0)
    a, b = split_trainer.step(x, y), whole.step(x, y)
    assert split_trainer.measured_peak_bytes == split_trainer.plan.peak_bytes
    assert a == pytest.approx(b, rel=len(graph.nodes) * U["bf16"])


# -- an inf loss -----------------------------------------------------------------------------
def _overflowing(tr):
    """``tr``'s network with its classifier's weights at 1e38: its logits, and so its loss, are inf or
    NaN in fp32 (and bf16, fp32's range); in fp16 the weights' low copy is inf already."""
    w = tr.net.fc.weight.data
    good = w.copy()
    w *= np.float32(1e38) / np.abs(w).max()
    return good


@pytest.mark.filterwarnings("ignore::RuntimeWarning")      # inf - inf and inf * 0 in the skipped step
def test_fp16_inf_loss_is_a_skipped_step_with_the_scale_backed_off():
    tr = trainer("fp16")
    good = _overflowing(tr)
    before = {k: np.array(v) for k, v in tr.net.state_dict().items()}
    x, y = data(0)
    loss = tr.step(x, y)                                                 # no NumericalError
    assert not np.isfinite(loss)
    assert tr.scaler.skipped_steps == 1 and tr.scaler.scale == 2.0 ** 15 and tr.scaler.growth_tracker == 0
    for k, v in tr.net.state_dict().items():                           # the update skipped
        if "running" not in k and "num_batches" not in k:
            assert np.array_equal(np.asarray(v), before[k]), k
    tr.net.fc.weight.data[...] = good                                    # a finite loss again: a clean step
    assert np.isfinite(tr.step(x, y))
    assert tr.scaler.skipped_steps == 1 and tr.scaler.scale == 2.0 ** 15 and tr.scaler.growth_tracker == 1
    assert not np.array_equal(tr.net.fc.weight.data, good)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fp32_and_bf16_inf_loss_is_still_a_numerical_error(precision):
    tr = trainer(precision)
    _overflowing(tr)
    before = {k: np.array(v) for k, v in tr.net.state_dict().items()}
    with pytest.raises(mdn.errors.NumericalError, match="the loss is (inf|nan) at training step 1"):
        tr.step(*data(0))
    assert tr.steps_done == 0
    for k, v in tr.net.state_dict().items():
        assert np.array_equal(np.asarray(v), before[k]), k
