"""Synchronized BatchNorm: statistics over the global mini-batch, as one process takes them.

The forward gathers each rank's per-channel (count, mean, biased variance) and
combines them in rank order with Chan's parallel formula in float64, so every
rank gets the same bits and no sum of squares loses the variance to
cancellation. The backward sums, over the ranks, the two per-channel
reductions the input gradient needs (of gy and of gy * (x - mean)); gamma's and
beta's gradients stay this rank's own sums, since the gradient buckets add
them up with every other gradient. Both run the backend's BatchNorm kernels,
so they work on either backend; only per-channel vectors cross to the host.

Under mixed precision (bf16/fp16 activations) nothing of this is low precision:
the statistics and their combination are float64 from the op's fp32 values (on
the CPU the op stages its low x, gy and gx in fp32, ``ops.staging``), the mean
and variance written back are in the statistics' dtype (float32: the
parameters'), and so are the per-channel coefficients of the input gradient.

Each collective goes through the communication thread in program order and
waits for its own result: the statistics are needed before the next kernel. The
wait has no deadline of its own: the communication thread fails a collective a
peer does not join, naming that peer.

A rank with no sample of a mini-batch (the last one, smaller than the ranks)
runs a stand-in sample of no weight (``contributes`` False): it sends a count
of zero and zero sums, so the statistics and gradients are the real samples',
and gives the stand-in no input gradient (the global sums would give it one).
"""
from __future__ import annotations

import numpy as np


class BatchNormSync:
    """The ``ctx.sync`` a training-mode BatchNorm calls where its statistics cross ranks."""

    def __init__(self, comm, to_host, xp=np):
        self.comm, self.to_host, self.xp = comm, to_host, xp
        self.log = None            # a list: (what, bytes, pending, (wait start, end)) of each collective
        self.contributes = True    # False: this rank's batch is a stand-in, counted as no sample

    def _wait(self, what, nbytes, pending):
        t0 = self.comm.clock()
        pending.wait()
        if self.log is not None:
            self.log.append((what, nbytes, pending, (t0, self.comm.clock())))

    def statistics(self, mean, var, count) -> int:
        """Replace this rank's ``mean`` and biased ``var`` (of ``count`` values per channel) by the
        global ones, in place; returns the global count."""
        c = mean.size
        send = np.zeros(1 + 2 * c)
        if self.contributes:
            send[0] = count
            send[1:1 + c] = self.to_host(mean)
            send[1 + c:] = self.to_host(var)
        recv = np.empty((self.comm.size, send.size))
        self._wait("BatchNorm statistics", recv.nbytes, self.comm.allgather(send, recv))
        n = recv[:, :1]
        total = n.sum()
        means, variances = recv[:, 1:1 + c], recv[:, 1 + c:]
        g_mean = (n * means).sum(axis=0) / total
        g_var = (n * (variances + (means - g_mean) ** 2)).sum(axis=0) / total
        mean[...] = self.xp.asarray(g_mean.astype(mean.dtype))
        var[...] = self.xp.asarray(g_var.astype(var.dtype))
        return int(total)

    def backward(self, k, x, gy, gamma, mean, invstd, gx, ggamma, gbeta):
        """BatchNorm's training backward with the per-channel sums taken over every rank:
        gx = a * gy - a * k * (x - mean) - a * sum(gy) / M, with a = gamma * invstd and
        k = sum(gy * (x - mean)) * invstd^2 / M over the global batch of M values per channel.

        The kernel ``k.bn_backward`` gives this rank's sums (exactly, in float64; the input
        gradient it also writes is overwritten); then gx = a * gy, and ``k.bn_forward_train``
        adds the affine rest in place (y = x * alpha + shift + residual, y the residual): the
        backend's kernels only, no temporary of the batch's size."""
        xp, c = self.xp, mean.size
        dtype = mean.dtype        # the per-channel coefficients in the statistics' dtype (fp32 under mixed precision)
        ggamma = ggamma if ggamma is not None else xp.empty(c, dtype)
        gbeta = gbeta if gbeta is not None else xp.empty(c, dtype)
        k.bn_backward(x, gy, gamma, mean, invstd, gx, ggamma, gbeta)
        inv = self.to_host(invstd).astype(np.float64)
        sums = np.zeros(1 + 2 * c)
        if self.contributes:
            sums[0] = gy.size // c
            sums[1:1 + c] = self.to_host(gbeta)               # sum(gy)
            sums[1 + c:] = self.to_host(ggamma) / inv         # sum(gy * (x - mean))
        self._wait("BatchNorm gradient sums", sums.nbytes, self.comm.allreduce(sums))
        if not self.contributes:     # the stand-in is no sample of the batch: the global sums give it no gradient
            gx[...] = 0
            return
        a = inv * self.to_host(gamma).astype(np.float64)
        slope = a * sums[1 + c:] * inv ** 2 / sums[0]
        shift = slope * self.to_host(mean).astype(np.float64) - a * sums[1:1 + c] / sums[0]
        xp.multiply(gy, xp.asarray(a.astype(dtype)).reshape(1, c, 1, 1), out=gx)
        k.bn_forward_train(x, xp.asarray((-slope).astype(dtype)), xp.asarray(shift.astype(dtype)),
                           xp.zeros(c, dtype), xp.ones(c, dtype), gx, False, gx)
