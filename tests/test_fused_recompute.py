"""Recomputing BatchNorm2d then ReLU in one pass, from the statistics the forward left.

A recomputed BatchNorm2d whose output only a recomputed ReLU reads is lowered
to one step of BatchNorm2dReLUOp: it reads the BN input and writes the ReLU
output, and the BN output is never materialized. Both the kernel and the
plans must give the forward's bits.
"""
import numpy as np
import pytest

import minidnn as mdn
from minidnn import models, nn, optim
from minidnn.autograd import build_schedule
from minidnn.backend import get_backend
from minidnn.graph import trace
from minidnn.memory import MemoryConfig, plan_memory
from minidnn.memory.program import Evict, lower, touches
from minidnn.ops.activation import ReLUOp
from minidnn.ops.norm import BatchNorm2dOp, BatchNorm2dReLUOp
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
def test_bn_relu_kernel_gives_the_bits_of_the_two_steps(device, dtype):
    be = get_backend(device)
    x, gamma, beta = (be.asarray(a) for a in bn_inputs(dtype))
    c = x.shape[1]
    mean, invstd = be.xp.zeros(c, dtype), be.xp.zeros(c, dtype)
    be.k.bn_stats(be.xp.ascontiguousarray(x[1:]), mean, invstd)    # statistics without the planted values
    invstd = 1 / be.xp.sqrt(invstd + 1e-5)
    y, r, fused = (be.xp.full(x.shape, 7.0, dtype) for _ in range(3))
    be.k.bn_forward_train(x, gamma, beta, mean, invstd, y)
    be.k.relu_forward(y, r)
    be.k.bn_forward_train(x, gamma, beta, mean, invstd, fused, relu=True)
    assert host(fused).tobytes() == host(r).tobytes()
    assert (host(fused) >= 0).sum() > x.size // 3        # not all clipped


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
    assert BatchNorm2dOp().fused(ReLUOp()) is not None
    assert BatchNorm2dOp().fused(BatchNorm2dOp()) is None
    assert BatchNorm2dReLUOp().fused(ReLUOp()) is None
    with pytest.raises(NotImplementedError, match="only as a recomputation"):
        BatchNorm2dReLUOp().backward(None, [], [], [], [], None)


def schedule(net, shape):
    g = trace(net, shape, loss=nn.CrossEntropyLoss())
    return build_schedule(g, optimizer=optim.SGD(lr=0.05, momentum=0.9))


def test_recomputed_batch_norm_and_relu_lower_to_one_step():
    sched = schedule(models.get("resnet20"), (8, 3, 32, 32))
    producer = {t: s for s in sched.steps if s.kind == "forward" for t in s.outs}
    touch = touches(sched)
    relu_outs = [(t, len(ts) - 2) for t, ts in touch.items()
                 if t in producer and isinstance(producer[t].node.op, ReLUOp)
                 and isinstance(producer[producer[t].ins[0]].node.op, BatchNorm2dOp)]
    evictions = {}
    for t, g in relu_outs:           # drop each ReLU output and the BN output it came from
        evictions[t, g] = Evict("recompute")
        y = producer[t].ins[0]
        evictions[y, len(touch[y]) - 2] = Evict("recompute")
    prog = lower(sched, evictions, touch)
    fused = [s for s in prog.steps if s.kind == "recompute" and isinstance(s.node.op, BatchNorm2dReLUOp)]
    assert len(fused) == len(relu_outs)
    for s in fused:
        relu_out, bn_out = s.outs[0], producer[s.outs[0]].ins[0]
        assert s.writes == [relu_out]                      # the statistics are on the device
        assert producer[bn_out].ins[0] in s.ins
        assert not any(r.tensor == bn_out and r.start == s.index for r in prog.residencies)


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
    assert any(isinstance(s.node.op, BatchNorm2dReLUOp) for s in t.plan.program.steps if s.kind == "recompute")
    assert losses == ref_losses
    for k in ref_state:
        assert np.array_equal(state[k], ref_state[k]), k
    assert t.measured_peak_bytes == t.plan.peak_bytes <= int(0.7 * liveness.peak_bytes)
