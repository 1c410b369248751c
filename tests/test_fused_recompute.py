"""Recomputing BatchNorm2d, a residual add and a ReLU in one pass, from the statistics the forward left.

A recomputed BatchNorm2d whose output only a recomputed ReLU or add reads is
lowered to one step of FusedBatchNorm2dOp (and an add's output only a ReLU
reads, merged on): it reads the BN input (and the add's other operand) and
writes the last op's output; the outputs between are never materialized. Both
the kernel and the plans must give the forward's bits.
"""
import numpy as np
import pytest

import minidnn as mdn
from minidnn import models, nn, optim
from minidnn.autograd import build_schedule
from minidnn.backend import get_backend
from minidnn.graph import trace
from minidnn.memory import MemoryConfig, plan_memory
from minidnn.memory.facts import touches
from minidnn.memory.program import Evict, lower
from minidnn.ops.activation import ReLUOp
from minidnn.ops.elementwise import AddOp
from minidnn.ops.norm import BatchNorm2dOp, FusedBatchNorm2dOp
from harness import host


def bn_inputs(dtype, shape=(3, 5, 7, 6), seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    c = shape[1]
    gamma, beta = rng.standard_normal(c).astype(dtype), rng.standard_normal(c).astype(dtype)
    beta[0] = 0.0
    x[0, 0, 0, :3] = [-0.0, np.nan, np.inf]          # signed zero and non-finite values pass alike
    return x, gamma, beta


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("add", [False, True])
@pytest.mark.parametrize("relu", [False, True])
def test_fused_kernel_gives_the_bits_of_the_separate_steps(device, dtype, add, relu):
    be = get_backend(device)
    x, gamma, beta = (be.asarray(a) for a in bn_inputs(dtype))
    residual = be.asarray(np.random.default_rng(9).standard_normal(x.shape).astype(dtype))
    c = x.shape[1]
    mean, invstd = be.xp.zeros(c, dtype), be.xp.zeros(c, dtype)
    be.k.bn_stats(be.xp.ascontiguousarray(x[1:]), mean, invstd)    # statistics without the planted values
    invstd = 1 / be.xp.sqrt(invstd + 1e-5)
    want, fused = be.xp.full(x.shape, 7.0, dtype), be.xp.full(x.shape, 7.0, dtype)
    be.k.bn_forward_train(x, gamma, beta, mean, invstd, want)
    if add:
        be.k.add(want, residual, want)
    if relu:
        be.k.relu_forward(want, want)
    be.k.bn_forward_train(x, gamma, beta, mean, invstd, fused, relu=relu, residual=residual if add else None)
    assert host(fused).tobytes() == host(want).tobytes()
    assert (host(fused) < 0).any() != relu


def test_fused_kernel_refuses_a_residual_of_another_shape():
    x = np.ones((2, 3, 4), np.float32)
    v = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="residual"):
        mdn.backend.get_backend("cpu").k.bn_forward_train(x, v, v, v, v, np.empty_like(x),
                                                           residual=np.ones((2, 3, 5), np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batch_norm_recomputed_from_its_statistics_gives_the_forward_bits(device, dtype):
    be = get_backend(device)
    ctx = mdn.executor.Context.on(be, np.random.default_rng(0))
    x, gamma, beta = (be.asarray(a) for a in bn_inputs(dtype, seed=3))
    x[0, 0, 0, :3] = 0.5
    c = x.shape[1]
    rmean, rvar = be.xp.zeros(c, dtype), be.xp.ones(c, dtype)
    outs = [be.xp.empty(x.shape, dtype), be.xp.empty(c, dtype), be.xp.empty(c, dtype)]
    op = BatchNorm2dOp()
    op.forward(ctx, [x, gamma, beta, rmean, rvar], outs, None)
    moved = host(rmean)
    for fused, restore in [(False, (True, False, False)), (True, (True, False, False)), (True, (True, True, True))]:
        again = [be.xp.full(x.shape, np.nan, dtype)] + ([outs[1], outs[2]] if not restore[1] else
                                                         [be.xp.full(c, np.nan, dtype), be.xp.full(c, np.nan, dtype)])
        ctx.recompute = True
        (op.fused(ReLUOp()) if fused else op).recompute(ctx, [x, gamma, beta, rmean, rvar], again, None, restore)
        ctx.recompute = False
        want = np.maximum(host(outs[0]), 0) if fused else host(outs[0])
        assert host(again[0]).tobytes() == want.tobytes(), (fused, restore)
        assert host(again[2]).tobytes() == host(outs[2]).tobytes()
    assert host(rmean).tobytes() == moved.tobytes()          # the statistics moved once


def test_only_a_recomputation_runs_the_fused_op():
    bn = BatchNorm2dOp()
    assert bn.fused(ReLUOp()).name == "batch_norm2d+relu"
    assert bn.fused(AddOp()).fused(ReLUOp()).name == "batch_norm2d+add+relu"
    assert bn.fused(BatchNorm2dOp()) is None
    assert bn.fused(ReLUOp()).fused(ReLUOp()) is None
    assert bn.fused(ReLUOp()).fused(AddOp()) is None           # a ReLU's output is not the add's input here
    with pytest.raises(NotImplementedError, match="only as a recomputation"):
        bn.fused(ReLUOp()).backward(None, [], [], [], [], None)


def schedule(net, shape):
    g = trace(net, shape, loss=nn.CrossEntropyLoss())
    return build_schedule(g, optimizer=optim.SGD(lr=0.05, momentum=0.9))


def test_recomputed_batch_norm_add_and_relu_lower_to_one_step():
    """Every ReLU output of ResNet-20 recomputed: BN -> ReLU and BN -> add -> ReLU chains each
    become one step that writes the ReLU output alone."""
    sched = schedule(models.get("resnet20"), (8, 3, 32, 32))
    producer = {t: s for s in sched.steps if s.kind == "forward" for t in s.outs}
    touch = touches(sched)
    op = lambda t: producer[t].node.op if t in producer else None          # noqa: E731
    chains = {}                      # ReLU output -> (the intermediate outputs, the fused op's name)
    for t in touch:
        if isinstance(op(t), ReLUOp):
            u = producer[t].ins[0]
            if isinstance(op(u), BatchNorm2dOp):
                chains[t] = ([u], "batch_norm2d+relu")
            elif isinstance(op(u), AddOp):
                bn = [v for v in producer[u].ins if isinstance(op(v), BatchNorm2dOp)]
                chains[t] = ([u, bn[0]], "batch_norm2d+add+relu")
    assert {name for _, name in chains.values()} == {"batch_norm2d+relu", "batch_norm2d+add+relu"}
    evictions = {(t, len(touch[t]) - 2): Evict("recompute") for t in chains}    # each one's backward gap
    prog = lower(sched, evictions, touch)
    fused = {s.outs[0]: s for s in prog.steps if s.kind == "recompute" and isinstance(s.node.op, FusedBatchNorm2dOp)}
    assert set(fused) == set(chains)
    for t, (between, name) in chains.items():
        s = fused[t]
        assert s.node.op.name == name and s.writes == [t]         # the statistics are on the device
        assert not any(r.tensor in between and r.start == s.index for r in prog.residencies)
    assert not any(s.kind == "recompute" and isinstance(s.node.op, (ReLUOp, AddOp)) for s in prog.steps)


def test_a_recompute_plan_with_fused_steps_trains_bitwise_like_unlimited_memory():
    shape = (8, 3, 32, 32)
    rng = np.random.default_rng(1)
    data = [(rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, 8)) for _ in range(3)]

    def train(memory):
        net = models.get("resnet20").init_parameters(0)
        t = mdn.compile(net, shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.05, momentum=0.9), memory=memory,
                        trace_every=0)
        return t, [t.step(x, y) for x, y in data], {k: np.array(v) for k, v in net.state_dict().items()}

    _, ref_losses, ref_state = train(MemoryConfig(algorithms="default"))
    liveness = plan_memory(schedule(models.get("resnet20"), shape), MemoryConfig(algorithms="default"))
    t, losses, state = train(MemoryConfig(budget=int(0.7 * liveness.peak_bytes), policy="recompute",
                                          algorithms="default", poison=True, check=True))
    assert any(isinstance(s.node.op, FusedBatchNorm2dOp) for s in t.plan.program.steps if s.kind == "recompute")
    assert losses == ref_losses
    for k in ref_state:
        assert np.array_equal(state[k], ref_state[k]), k
    assert t.measured_peak_bytes == t.plan.peak_bytes <= int(0.7 * liveness.peak_bytes)
