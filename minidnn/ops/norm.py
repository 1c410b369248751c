"""Batch normalization over (N, H, W) per channel, PyTorch's semantics.

Training-mode forward writes the batch mean and inverse std as two small extra
outputs (the backward reads them) and updates the running statistics in place
- except when it runs again as a recomputation, so statistics move once a step.
A recomputation whose statistics are still on the device normalizes with them
(one pass instead of three); followed by a recomputed residual add and/or ReLU,
it recomputes them in that pass too (:class:`FusedBatchNorm2dOp`).

With data-parallel ranks, ``ctx.sync`` (minidnn.distributed.batchnorm) takes the
statistics and the backward's two per-channel sums over the global mini-batch.
"""
from __future__ import annotations

from ..errors import ShapeError
from ..graph import Spec, find_graph
from .activation import ReLUOp
from .base import Op, apply
from .elementwise import AddOp, reshape


def update_running_stats(xp, rmean, rvar, mean, var, momentum, m):
    """PyTorch's running statistics' update from a batch of ``m`` values per channel, unless the
    batch's statistics are not finite (its loss will be refused, leaving the model as it was).

    The test stays on the device: both updates are computed and the old values kept where the
    batch is not finite (``copyto(where=)`` with a 0-d mask), so a CuPy step does not wait for
    the GPU here twice per BatchNorm (``bool`` of a device array is a host sync). The arithmetic
    is the in-place update's, rounded the same way."""
    finite = xp.isfinite(mean).all() & xp.isfinite(var).all()
    xp.copyto(rmean, rmean * (1 - momentum) + momentum * mean, where=finite)
    xp.copyto(rvar, rvar * (1 - momentum) + (momentum * m / (m - 1)) * var, where=finite)


class BatchNorm2dOp(Op):
    name = "batch_norm2d"
    saved_inputs = (0, 1)
    saved_outputs = (1, 2)
    no_grad_inputs = (3, 4)
    flops_per_output = 8
    add = False           # y = batch_norm(x) + ins[5]  } in the fused recomputation's op
    relu = False          # y = relu(...)                }

    def __init__(self, training=True, momentum=0.1, eps=1e-5):
        self.training, self.momentum, self.eps = training, momentum, eps
        if not training:                      # frozen statistics: y is affine in x
            self.saved_inputs = (0, 1, 3)
            self.saved_outputs = (2,)

    def infer(self, x, gamma, beta, rmean, rvar):
        if len(x.shape) != 4:
            raise ShapeError(f"expected a 4-D input (N, C, H, W), got {len(x.shape)}-D")
        c = x.shape[1]
        if gamma.shape != (c,):
            raise ShapeError(f"expected {gamma.shape[0]} channels, got {c}")
        if self.training and x.shape[0] * x.shape[2] * x.shape[3] < 2:
            raise ShapeError("expected more than 1 value per channel when training")
        # the batch statistics in the parameters' dtype: fp32 under mixed precision (a low x)
        return [Spec(x.shape, x.dtype), Spec((c,), gamma.dtype), Spec((c,), gamma.dtype)]

    def forward(self, ctx, ins, outs, ws):
        xp = ctx.xp
        x, gamma, beta, rmean, rvar = ins[:5]
        y, mean, invstd = outs
        if not self.training:
            xp.add(rvar, self.eps, out=invstd)
            xp.sqrt(invstd, out=invstd)
            xp.reciprocal(invstd, out=invstd)
            self._normalize(ctx, ins, rmean, invstd, y)
            return
        ctx.k.bn_stats(x, mean, invstd)          # invstd holds the biased variance here
        m = x.shape[0] * x.shape[2] * x.shape[3]
        if ctx.sync is not None:                 # data-parallel: the global mini-batch's statistics
            m = ctx.sync.statistics(mean, invstd, m)
        if not ctx.recompute:                    # statistics move once a step
            update_running_stats(xp, rmean, rvar, mean, invstd, self.momentum, m)
        invstd += self.eps
        xp.sqrt(invstd, out=invstd)
        xp.reciprocal(invstd, out=invstd)
        self._normalize(ctx, ins, mean, invstd, y)

    def _normalize(self, ctx, ins, mean, invstd, y):
        ctx.k.bn_forward_train(ins[0], ins[1], ins[2], mean, invstd, y, self.relu, ins[5] if self.add else None)

    def recompute(self, ctx, ins, outs, ws, restore):
        if self.training and not (restore[1] or restore[2]):
            # the batch statistics are on the device as the forward computed them: y from them
            # alone is one pass, and the forward's bits
            self._normalize(ctx, ins, outs[1], outs[2], outs[0])
        else:
            self.forward(ctx, ins, outs, ws)

    def fused(self, consumer):
        if isinstance(consumer, ReLUOp) and not self.relu:
            return FusedBatchNorm2dOp(self.training, self.momentum, self.eps, add=self.add, relu=True)
        if isinstance(consumer, AddOp) and not (self.add or self.relu):
            return FusedBatchNorm2dOp(self.training, self.momentum, self.eps, add=True)
        return None

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp = ctx.xp
        x, gamma, gy = ins[0], ins[1], gouts[0]
        mean = outs[1] if self.training else ins[3]
        invstd = outs[2]
        if self.training and gins[0] is not None and ctx.sync is not None:
            ctx.sync.backward(ctx.k, x, gy, gamma, mean, invstd, gins[0], gins[1], gins[2])
            return
        if self.training and gins[0] is not None:
            ctx.k.bn_backward(x, gy, gamma, mean, invstd, gins[0], gins[1], gins[2])
            return
        # frozen statistics, or no input gradient wanted: per-channel sums without a temporary
        sum_gy = gy.sum(axis=(0, 2, 3))
        sum_gyx = xp.einsum("nchw,nchw->c", gy, x)
        if gins[2] is not None:
            gins[2][...] = sum_gy
        if gins[1] is not None:
            gins[1][...] = invstd * (sum_gyx - mean * sum_gy)
        if gins[0] is not None:
            xp.multiply(gy, (gamma * invstd).reshape(1, -1, 1, 1), out=gins[0])


class FusedBatchNorm2dOp(BatchNorm2dOp):
    """BatchNorm2d, then a residual add (its other operand an extra last input) and/or a ReLU,
    in one pass: for recomputation only. The lowering runs it where a recomputed BatchNorm2d
    output feeds nothing but the recomputed add or ReLU. Its outputs are the last op's, the
    mean and the inverse std. The graph keeps the separate ops, so this one has no backward."""

    def __init__(self, training=True, momentum=0.1, eps=1e-5, add=False, relu=False):
        super().__init__(training, momentum, eps)
        self.add, self.relu = add, relu
        self.name = "batch_norm2d" + "+add" * add + "+relu" * relu

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        raise NotImplementedError(f"{self.name} runs only as a recomputation; the graph holds its "
                                  f"ops, whose backwards run")


def batch_norm2d(x, weight, bias, running_mean, running_var, training=True, momentum=0.1, eps=1e-5):
    return apply(BatchNorm2dOp(training, momentum, eps), x, weight, bias, running_mean, running_var)[0]


def batch_norm1d(x, weight, bias, running_mean, running_var, training=True, momentum=0.1, eps=1e-5):
    """BatchNorm over (N, C) or (N, C, L), per channel: BatchNorm2d's op on x viewed as
    (N, C, 1, 1) or (N, C, L, 1), so it shares its kernels, its recomputation, its statistics over
    sub-batches and over data-parallel ranks."""
    shape = tuple(x.shape)
    if len(shape) not in (2, 3):
        raise _shape_error(x, f"expected a 2-D (N, C) or 3-D (N, C, L) input, got {len(shape)}-D")
    if shape[1] != weight.shape[0]:
        raise _shape_error(x, f"expected {weight.shape[0]} channels, got {shape[1]}")
    if training and shape[0] * (shape[2] if len(shape) == 3 else 1) < 2:
        raise _shape_error(x, "expected more than 1 value per channel when training")
    x4 = reshape(x, shape + (1,) * (4 - len(shape)))
    return reshape(batch_norm2d(x4, weight, bias, running_mean, running_var, training, momentum, eps), shape)


def _shape_error(x, msg):
    return ShapeError(f"{find_graph(x).path or '<root>'} (batch_norm1d): {msg} [input shapes {tuple(x.shape)}]")
