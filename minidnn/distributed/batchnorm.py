"""Synchronized BatchNorm: statistics over the global mini-batch, as one process takes them.

The forward gathers each rank's per-channel (count, mean, biased variance) and
combines them in rank order with Chan's parallel formula in float64, so every
rank gets the same bits and no sum of squares loses the variance to
cancellation. The backward sums, over the ranks, the two per-channel
reductions the input gradient needs (of gy and of gy * (x - mean)); gamma's and
beta's gradients stay this rank's own sums, since the gradient buckets add
them up with every other gradient.

Each collective goes through the communication thread in program order and
waits for its own result: the statistics are needed before the next kernel.
"""
from __future__ import annotations

import numpy as np


class BatchNormSync:
    """The ``ctx.sync`` a training-mode BatchNorm calls where its statistics cross ranks."""

    def __init__(self, comm, timeout, to_host, xp=np):
        self.comm, self.timeout, self.to_host, self.xp = comm, timeout, to_host, xp

    def statistics(self, mean, var, count) -> int:
        """Replace this rank's ``mean`` and biased ``var`` (of ``count`` values per channel) by the
        global ones, in place; returns the global count."""
        c = mean.size
        send = np.empty(1 + 2 * c)
        send[0] = count
        send[1:1 + c] = self.to_host(mean)
        send[1 + c:] = self.to_host(var)
        recv = np.empty((self.comm.size, send.size))
        self.comm.allgather(send, recv).wait(self.timeout)
        n = recv[:, :1]
        total = n.sum()
        means, variances = recv[:, 1:1 + c], recv[:, 1 + c:]
        g_mean = (n * means).sum(axis=0) / total
        g_var = (n * (variances + (means - g_mean) ** 2)).sum(axis=0) / total
        mean[...] = self.xp.asarray(g_mean.astype(mean.dtype))
        var[...] = self.xp.asarray(g_var.astype(var.dtype))
        return int(total)

    def backward(self, x, gy, gamma, mean, invstd, gx, ggamma, gbeta):
        """BatchNorm's training backward with the per-channel sums taken over every rank:
        gx = gamma * invstd * (gy - mean(gy) - (x - mean) * invstd^2 * mean(gy * (x - mean))),
        formed per sample in float64 and rounded once, as the one-process kernel does."""
        c = mean.size
        mean64 = self.to_host(mean).astype(np.float64)
        invstd64 = self.to_host(invstd).astype(np.float64)
        gy_h, x_h = self.to_host(gy), self.to_host(x)
        sums = np.empty(1 + 2 * c)
        sums[0] = gy.size // c
        sum_gy = sums[1:1 + c]
        sum_gyxm = sums[1 + c:]
        sum_gy[...] = 0
        sum_gyxm[...] = 0
        for n in range(x_h.shape[0]):            # float64 sums a sample at a time: no batch-sized temporary
            g = gy_h[n].astype(np.float64)
            sum_gy += g.sum(axis=(1, 2))
            sum_gyxm += np.einsum("chw,chw->c", g, x_h[n] - mean64[:, None, None])
        if gbeta is not None:
            gbeta[...] = self.xp.asarray(sum_gy.astype(gbeta.dtype))
        if ggamma is not None:
            ggamma[...] = self.xp.asarray((invstd64 * sum_gyxm).astype(ggamma.dtype))
        self.comm.allreduce(sums).wait(self.timeout)
        m = sums[0]
        a = self.to_host(gamma).astype(np.float64) * invstd64
        slope = a * invstd64 ** 2 * sums[1 + c:] / m
        shift = a * sums[1:1 + c] / m - slope * mean64
        out = np.empty(x_h.shape[1:], gx.dtype)
        for n in range(x_h.shape[0]):
            v = a[:, None, None] * gy_h[n] - slope[:, None, None] * x_h[n] - shift[:, None, None]
            np.copyto(out, v, casting="same_kind")
            gx[n] = self.xp.asarray(out)
