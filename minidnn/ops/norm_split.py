"""Batch normalization of a mini-batch that runs as k sub-batches, with the full batch's statistics.

One training-mode BatchNorm over B = k * b samples becomes three kinds of op,
so that no step ever holds more than one sub-batch (``split_graph`` builds them):

- ``batch_norm2d_stats`` (one per sub-batch): the sub-batch's per-channel mean,
  sum of squared deviations and count, in float64;
- ``batch_norm2d_combine`` (one): the full batch's mean and 1/std from the k
  partial statistics (Chan's parallel formula), and the running statistics'
  update, once, with the full batch's unbiased variance;
- ``batch_norm2d_apply`` (one per sub-batch): y = (x - mean) * invstd * gamma + beta.

The forward rounds the combined statistics to the training dtype exactly as
the unsplit op does. The backward is BatchNorm's, split in the same three
places, and the three ops are only meaningful together (the buffers between
their backward steps carry BatchNorm's intermediate sums, not each op's own
chain rule):

1. each apply step leaves gy, unscaled, in its input's gradient buffer, and adds
   its sub-batch's per-channel sums of gy and gy * (x - mean) into the
   "gradients" of mean and invstd (autodiff's accumulation adds them up);
2. the combine step, with the full batch's sums, writes gamma's and beta's
   gradients and, for each sub-batch, the coefficients of its input gradient;
3. each stats step turns its sub-batch's gy into the input gradient, in place:
   gx = gamma * invstd * (gy - mean(gy) - (x - mean) * invstd^2 * mean(gy * (x - mean))).

So, as in the unsplit kernel, gx is formed from gy in one expression (in float64,
rounded once), and gamma's and beta's gradients from the full float64 sums.
Per-channel sums go through float64 scratch a sixteenth of the rows at a time,
so no op allocates a sub-batch-sized temporary. Every array is made with the
backend's array module (``ctx.xp``): a NumPy index or temporary beside CuPy
arrays fails on the cuda backend. ``split_graph`` checks
that a BatchNorm's input has no other reader, which the in-place step 3 needs.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..graph import Spec
from .base import Op, carve, nbytes_of
from .norm import update_running_stats

F64 = np.dtype(np.float64)


BLOCKS = 16    # per-channel sums run over 1/16 of the rows at a time: scratch is 1/16 of x, in float64


def _block(x, n=1):
    """Scratch for ``n`` float64 blocks of rows of ``x`` viewed as (N*C, H*W)."""
    rows = x.shape[0] * x.shape[1]
    return [((-(-rows // BLOCKS), x.shape[2] * x.shape[3]), F64)] * n


def _blocks(xp, x, *arrays):
    """(first row, channel of each row, the same rows of each array) for successive row blocks of
    (N*C, H*W) views."""
    n, c = x.shape[0], x.shape[1]
    flat = [a.reshape(n * c, -1) for a in arrays]
    step = -(-n * c // BLOCKS)
    for r0 in range(0, n * c, step):
        r1 = min(r0 + step, n * c)
        yield r0, xp.arange(r0, r1) % c, [f[r0:r1] for f in flat]


def _per_channel(xp, r0, rows, c):
    """Sum of each row of ``rows`` (rows r0.. of an (N*C, H*W) view) into its channel, row after row.

    The row sums are laid out (rows, C) and summed down the columns, not with bincount: CuPy's
    bincount adds its weights with atomics, in no fixed order, and NumPy's adds them in row order,
    which the column sum keeps (the same bits)."""
    s = rows.sum(axis=1)
    lead = r0 % c
    padded = xp.zeros(-(-(lead + len(s)) // c) * c, F64)
    padded[lead:lead + len(s)] = s
    return padded.reshape(-1, c).sum(axis=0)


class BatchNormStatsOp(Op):
    """stats = (per-channel mean, sum of squared deviations, count) of one sub-batch.

    Backward (step 3 above): ``gouts[0]`` holds (scale, shift, slope) per channel
    and the input's gradient buffer holds gy; it becomes
    scale * gy - shift - slope * (x - mean_j).
    """

    name = "batch_norm2d_stats"
    saved_inputs = (0,)
    saved_outputs = (0,)
    accumulating_inputs = (0,)

    def infer(self, x):
        if len(x.shape) != 4:
            raise ShapeError(f"expected a 4-D input (N, C, H, W), got {len(x.shape)}-D")
        return [Spec((3, x.shape[1]), F64)]

    def flops(self, ins, outs):
        return 4.0 * np.prod(ins[0].shape)

    def workspace(self, ins, outs):
        return nbytes_of(_block(ins[0]))

    def backward_workspace(self, ins, outs):
        return nbytes_of(_block(ins[0], 2))

    def forward(self, ctx, ins, outs, ws):
        xp, x, st = ctx.xp, ins[0], outs[0]
        c = x.shape[1]
        (w,) = carve(ws, _block(x))
        st[...] = 0
        for r0, ch, (xr,) in _blocks(xp, x, x):
            v = w[:len(ch)]
            xp.copyto(v, xr)
            st[0] += _per_channel(xp, r0, v, c)
        st[2] = x.size // c
        st[0] /= st[2]
        for r0, ch, (xr,) in _blocks(xp, x, x):
            v = w[:len(ch)]
            xp.copyto(v, xr)
            v -= st[0][ch, None]
            xp.square(v, out=v)
            st[1] += _per_channel(xp, r0, v, c)

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        if 0 not in ctx.accumulate:
            raise RuntimeError("batch_norm2d_stats: the input's gradient buffer must hold gy from its "
                               "batch_norm2d_apply (built by split_graph)")
        xp, x, st, (scale, shift, slope), gx = ctx.xp, ins[0], outs[0], gouts[0], gins[0]
        w, u = carve(ws, _block(x, 2))
        for _, ch, (xr, gr) in _blocks(xp, x, x, gx):
            v, t = w[:len(ch)], u[:len(ch)]
            xp.copyto(v, xr)
            v -= st[0][ch, None]
            v *= -slope[ch, None]
            v -= shift[ch, None]
            xp.copyto(t, gr)
            t *= scale[ch, None]
            v += t
            xp.copyto(gr, v, casting="same_kind")


class BatchNormCombineOp(Op):
    """The full batch's mean and invstd from k sub-batches' stats; moves the running statistics once.

    Inputs: stats_0 .. stats_{k-1}, gamma, beta, running_mean, running_var.
    Outputs (float64, holding values of the training dtype): mean, invstd.
    Backward (step 2 above): ``gouts`` hold the full batch's sums of gy and of
    gy * (x - mean); it writes gamma's and beta's gradients and each stats'
    (scale, shift, slope).
    """

    name = "batch_norm2d_combine"
    saved_outputs = (0, 1)

    def __init__(self, k, momentum=0.1, eps=1e-5):
        self.k, self.momentum, self.eps = k, momentum, eps
        self.saved_inputs = tuple(range(k + 1))
        self.no_grad_inputs = (k + 2, k + 3)

    def infer(self, *specs):
        k = self.k
        stats, gamma = specs[:k], specs[k]
        c = gamma.shape[0]
        if any(s.shape != (3, c) for s in stats):
            raise ShapeError(f"expected {k} sub-batch statistics of shape (3, {c}), got {[s.shape for s in stats]}")
        return [Spec((c,), F64), Spec((c,), F64)]

    def flops(self, ins, outs):
        return 8.0 * self.k * ins[-1].shape[0]

    def forward(self, ctx, ins, outs, ws):
        xp, k = ctx.xp, self.k
        stats, rmean, rvar = ins[:k], ins[k + 2], ins[k + 3]
        n = sum(float(s[2][0]) for s in stats)
        mean = sum(s[2] * s[0] for s in stats) / n
        m2 = sum(s[1] + s[2] * (s[0] - mean) ** 2 for s in stats)
        # from here on, the unsplit op's arithmetic in the training dtype
        dt = rmean.dtype
        mean_t, var_t = mean.astype(dt), (m2 / n).astype(dt)
        if not ctx.recompute:
            update_running_stats(xp, rmean, rvar, mean_t, var_t, self.momentum, n)
        var_t += self.eps
        xp.sqrt(var_t, out=var_t)
        xp.reciprocal(var_t, out=var_t)
        outs[0][...] = mean_t
        outs[1][...] = var_t

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp, k = ctx.xp, self.k
        stats, gamma = ins[:k], ins[k]
        mean, invstd = outs
        sum_gy = gouts[0] if gouts[0] is not None else xp.zeros_like(mean)
        sum_gyx = gouts[1] if gouts[1] is not None else xp.zeros_like(mean)
        n = sum(float(s[2][0]) for s in stats)
        scale = gamma * invstd
        slope = scale * invstd ** 2 * sum_gyx / n
        if gins[k] is not None:
            gins[k][...] = sum_gyx * invstd
        if gins[k + 1] is not None:
            gins[k + 1][...] = sum_gy
        for s, g in zip(stats, gins[:k]):
            if g is not None:
                g[0] = scale
                g[1] = scale * sum_gy / n + slope * (s[0] - mean)
                g[2] = slope


class BatchNormApplyOp(Op):
    """y = (x - mean) * invstd * gamma + beta for one sub-batch, with the full batch's mean and invstd.

    Backward (step 1 above): gy into x's gradient buffer, and this sub-batch's
    sums of gy and gy * (x - mean) into those of mean and invstd. Gamma's and
    beta's gradients come from the combine step (their inputs here take none).
    """

    name = "batch_norm2d_apply"
    saved_inputs = (0, 3)
    no_grad_inputs = (1, 2)
    flops_per_output = 2

    def infer(self, x, gamma, beta, mean, invstd):
        if len(x.shape) != 4:
            raise ShapeError(f"expected a 4-D input (N, C, H, W), got {len(x.shape)}-D")
        c = x.shape[1]
        if gamma.shape != (c,) or mean.shape != (c,) or invstd.shape != (c,):
            raise ShapeError(f"expected {gamma.shape[0]} channels, got {c}")
        return [Spec(x.shape, x.dtype)]

    def backward_workspace(self, ins, outs):
        return nbytes_of(_block(ins[0]))

    def forward(self, ctx, ins, outs, ws):
        x, gamma, beta, mean, invstd = ins
        ctx.k.bn_forward_train(x, gamma, beta, mean.astype(x.dtype), invstd.astype(x.dtype), outs[0])

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp, x, mean, gy = ctx.xp, ins[0], ins[3], gouts[0]
        gx, _, _, sum_gy, sum_gyx = gins
        c = x.shape[1]
        (w,) = carve(ws, _block(x))
        sums = xp.zeros((2, c), F64)
        for r0, ch, (xr, gr) in _blocks(xp, x, x, gy):
            v = w[:len(ch)]
            xp.copyto(v, gr)
            sums[0] += _per_channel(xp, r0, v, c)
            xp.copyto(v, xr)
            v -= mean[ch, None]
            v *= gr
            sums[1] += _per_channel(xp, r0, v, c)
        if gx is not None:
            xp.copyto(gx, gy)
        if sum_gy is not None:
            sum_gy[...] = sums[0]
        if sum_gyx is not None:
            sum_gyx[...] = sums[1]
