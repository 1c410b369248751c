"""Batch normalization of a mini-batch that runs as k sub-batches, with the full batch's statistics.

One training-mode BatchNorm over B = k * b samples becomes three kinds of op,
so that no step ever holds more than one sub-batch (``split_graph`` builds them):

- ``batch_norm2d_stats`` (one per sub-batch): the sub-batch's per-channel mean
  and sum of squared deviations, in float64;
- ``batch_norm2d_combine`` (one): the full batch's mean and 1/std from the k
  partial statistics (Chan's parallel formula), and the running statistics'
  update, once, with the full batch's unbiased variance;
- ``batch_norm2d_apply`` (one per sub-batch): y = (x - mean) * invstd * gamma + beta.

Each op's backward is the chain rule of its own forward, so static autodiff
derives the exact BatchNorm backward: the apply steps add up the full batch's
sums of gy and gy * (x - mean) (the gradients of mean and invstd), and the
stats steps then add each sub-batch's share of the correction into its input
gradient. The combined statistics are rounded to the training dtype exactly as
the unsplit op rounds them, so the forward agrees with it to the last bits of
the float64 sums. Per-channel sums are taken in float64, one sample at a time
through a workspace of one sample, so no op allocates a sub-batch-sized temporary.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..graph import Spec
from .base import Op, carve, nbytes_of

F64 = np.dtype(np.float64)


def _one_sample(x):
    """Scratch for one sample of ``x`` (C, H*W), in float64."""
    return [((x.shape[1], x.shape[2] * x.shape[3]), F64)]


class BatchNormStatsOp(Op):
    """stats[0] = per-channel mean of one sub-batch, stats[1] = its sum of squared deviations."""

    name = "batch_norm2d_stats"
    saved_inputs = (0,)
    saved_outputs = (0,)
    flops_per_output = 0

    def infer(self, x):
        if len(x.shape) != 4:
            raise ShapeError(f"expected a 4-D input (N, C, H, W), got {len(x.shape)}-D")
        return [Spec((2, x.shape[1]), F64)]

    def flops(self, ins, outs):
        return 4.0 * np.prod(ins[0].shape)

    def workspace(self, ins, outs):
        return nbytes_of(_one_sample(ins[0]))

    backward_workspace = workspace

    def forward(self, ctx, ins, outs, ws):
        x, st = ins[0], outs[0]
        (w,) = carve(ws, _one_sample(x))
        xs = x.reshape(x.shape[0], x.shape[1], -1)
        st[...] = 0
        for sample in xs:
            np.copyto(w, sample)
            st[0] += w.sum(axis=1)
        st[0] /= xs.shape[0] * xs.shape[2]
        for sample in xs:
            np.copyto(w, sample)
            w -= st[0][:, None]
            np.square(w, out=w)
            st[1] += w.sum(axis=1)

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        # d mean_j / dx = 1 / count, d M2_j / dx = 2 (x - mean_j)
        x, st, g, gx = ins[0], outs[0], gouts[0], gins[0]
        (w,) = carve(ws, _one_sample(x))
        xs = x.reshape(x.shape[0], x.shape[1], -1)
        gxs = gx.reshape(xs.shape)
        shift = (g[0] / (xs.shape[0] * xs.shape[2]))[:, None]
        scale = (2 * g[1])[:, None]
        for sample, out in zip(xs, gxs):
            np.copyto(w, sample)
            w -= st[0][:, None]
            w *= scale
            w += shift
            np.copyto(out, w, casting="same_kind")


class BatchNormCombineOp(Op):
    """The full batch's mean and invstd from k sub-batches' stats; moves the running statistics once.

    Inputs: stats_0 .. stats_{k-1}, running_mean, running_var; ``counts`` are the
    values per channel of each sub-batch. Outputs (float64, holding values of
    the training dtype): mean, invstd.
    """

    name = "batch_norm2d_combine"
    saved_outputs = (0, 1)
    flops_per_output = 0

    def __init__(self, counts, momentum=0.1, eps=1e-5):
        self.counts, self.momentum, self.eps = tuple(counts), momentum, eps
        k = len(self.counts)
        self.saved_inputs = tuple(range(k))
        self.no_grad_inputs = (k, k + 1)

    def infer(self, *specs):
        k = len(self.counts)
        stats, rmean = specs[:k], specs[k]
        c = rmean.shape[0]
        if any(s.shape != (2, c) for s in stats):
            raise ShapeError(f"expected {k} sub-batch statistics of shape (2, {c}), got "
                             f"{[s.shape for s in stats]}")
        if sum(self.counts) < 2:
            raise ShapeError("expected more than 1 value per channel when training")
        return [Spec((c,), F64), Spec((c,), F64)]

    def flops(self, ins, outs):
        return 8.0 * len(self.counts) * ins[-1].shape[0]

    def forward(self, ctx, ins, outs, ws):
        k, n = len(self.counts), sum(self.counts)
        stats, rmean, rvar = ins[:k], ins[k], ins[k + 1]
        mean = sum(c * s[0] for c, s in zip(self.counts, stats)) / n
        m2 = sum(s[1] + c * (s[0] - mean) ** 2 for c, s in zip(self.counts, stats))
        # from here on, the unsplit op's arithmetic in the training dtype
        dt = rmean.dtype
        mean_t, var_t = mean.astype(dt), (m2 / n).astype(dt)
        if not ctx.recompute and np.isfinite(mean_t).all() and np.isfinite(var_t).all():
            mom = self.momentum
            rmean *= 1 - mom
            rmean += mom * mean_t
            rvar *= 1 - mom
            rvar += (mom * n / (n - 1)) * var_t
        var_t += self.eps
        np.sqrt(var_t, out=var_t)
        np.reciprocal(var_t, out=var_t)
        outs[0][...] = mean_t
        outs[1][...] = var_t

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        k, n = len(self.counts), sum(self.counts)
        mean, invstd = outs
        g_mean = gouts[0] if gouts[0] is not None else 0.0
        g_inv = gouts[1] if gouts[1] is not None else 0.0
        g_m2 = -0.5 * g_inv * invstd ** 3 / n          # invstd = (M2 / n + eps) ** -0.5
        for c, s, g in zip(self.counts, ins[:k], gins[:k]):
            if g is not None:
                g[0] = g_mean * (c / n) + 2 * c * (s[0] - mean) * g_m2
                g[1] = g_m2


class BatchNormApplyOp(Op):
    """y = (x - mean) * invstd * gamma + beta for one sub-batch, with the full batch's mean and invstd."""

    name = "batch_norm2d_apply"
    saved_inputs = (0, 1, 3, 4)
    flops_per_output = 2

    def infer(self, x, gamma, beta, mean, invstd):
        if len(x.shape) != 4:
            raise ShapeError(f"expected a 4-D input (N, C, H, W), got {len(x.shape)}-D")
        c = x.shape[1]
        if gamma.shape != (c,) or mean.shape != (c,) or invstd.shape != (c,):
            raise ShapeError(f"expected {gamma.shape[0]} channels, got {c}")
        return [Spec(x.shape, x.dtype)]

    def backward_workspace(self, ins, outs):
        return nbytes_of(_one_sample(ins[0]))

    def forward(self, ctx, ins, outs, ws):
        x, gamma, beta, mean, invstd = ins
        ctx.k.bn_forward_train(x, gamma, beta, mean.astype(x.dtype), invstd.astype(x.dtype), outs[0])

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        x, gamma, mean, invstd, gy = ins[0], ins[1], ins[3], ins[4], gouts[0]
        gx, ggamma, gbeta, gmean, ginv = gins
        (w,) = carve(ws, _one_sample(x))
        xs, gys = x.reshape(x.shape[0], x.shape[1], -1), gy.reshape(x.shape[0], x.shape[1], -1)
        sum_gy = np.zeros(x.shape[1], F64)
        sum_gyx = np.zeros(x.shape[1], F64)     # sum of gy * (x - mean)
        for sample, g in zip(xs, gys):
            np.copyto(w, g)
            sum_gy += w.sum(axis=1)
            np.copyto(w, sample)
            w -= mean[:, None]
            w *= g
            sum_gyx += w.sum(axis=1)
        a = invstd * gamma
        if gx is not None:
            np.multiply(gy, a.astype(x.dtype).reshape(1, -1, 1, 1), out=gx)
        if ggamma is not None:
            ggamma[...] = sum_gyx * invstd
        if gbeta is not None:
            gbeta[...] = sum_gy
        if gmean is not None:
            gmean[...] = -a * sum_gy
        if ginv is not None:
            ginv[...] = gamma * sum_gyx
