"""Losses: terminal ops whose backward seeds d(loss) = 1 itself."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..graph import Spec
from .base import Op, apply, carve, nbytes_of, same_float


def _upstream(ctx, gouts) -> float:
    """d(objective)/d(loss): the context's loss scale for the iteration's loss (1, or 1/k for one of
    k sub-batches), the incoming gradient if the loss feeds more ops."""
    return ctx.loss_scale if gouts[0] is None else float(gouts[0])


class CrossEntropyOp(Op):
    """Mean softmax cross-entropy of logits (N, K) against class indices (N,)."""

    name = "cross_entropy"
    saved_inputs = (0, 1)
    no_grad_inputs = (1,)
    is_loss = True
    flops_per_output = 5

    def infer(self, logits, labels):
        if len(logits.shape) != 2:
            raise ShapeError(f"expected logits of shape (N, classes), got {logits.shape}")
        if labels.shape != (logits.shape[0],) or np.dtype(labels.dtype).kind not in "iu":
            raise ShapeError(f"expected integer labels of shape ({logits.shape[0]},), got {labels.shape}")
        return [Spec((), logits.dtype)]

    def flops(self, ins, outs):
        return 5.0 * np.prod(ins[0].shape)

    def _scratch(self, logits):
        n, k = logits.shape
        return [((n, k), logits.dtype), ((n, k), logits.dtype), ((n, 1), logits.dtype)]

    def workspace(self, ins, outs):
        return nbytes_of(self._scratch(ins[0]))

    backward_workspace = workspace

    def _log_softmax(self, xp, x, ws):
        z, e, m = carve(ws, self._scratch(x))
        xp.max(x, axis=1, keepdims=True, out=m)
        xp.subtract(x, m, out=z)
        xp.exp(z, out=e)
        xp.sum(e, axis=1, keepdims=True, out=m)
        xp.log(m, out=m)
        z -= m
        return z

    def forward(self, ctx, ins, outs, ws):
        xp = ctx.xp
        logits, labels = ins
        z = self._log_softmax(xp, logits, ws)
        outs[0][...] = -z[xp.arange(len(labels)), labels].mean()

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp = ctx.xp
        logits, labels = ins
        gx = gins[0]
        z = self._log_softmax(xp, logits, ws)
        xp.exp(z, out=gx)
        gx[xp.arange(len(labels)), labels] -= 1
        gx *= gx.dtype.type(_upstream(ctx, gouts) / len(labels))


class MSEOp(Op):
    name = "mse"
    saved_inputs = (0, 1)
    no_grad_inputs = (1,)
    is_loss = True

    def infer(self, pred, target):
        if pred.shape != target.shape:
            raise ShapeError(f"prediction shape {pred.shape} != target shape {target.shape}")
        return [Spec((), pred.dtype)]

    def workspace(self, ins, outs):
        return nbytes_of([(ins[0].shape, ins[0].dtype)])

    def forward(self, ctx, ins, outs, ws):
        xp = ctx.xp
        (d,) = carve(ws, [(ins[0].shape, ins[0].dtype)])
        xp.subtract(ins[0], ins[1], out=d)
        d = d.ravel()
        outs[0][...] = xp.dot(d, d) / d.size

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp = ctx.xp
        gx = gins[0]
        xp.subtract(ins[0], ins[1], out=gx)
        gx *= gx.dtype.type(2.0 * _upstream(ctx, gouts) / gx.size)


class MeanOfLossesOp(Op):
    """The mean of k scalar losses: the loss of a mini-batch whose k equal sub-batches each
    computed their own mean loss (``split_graph``)."""

    name = "mean_of_losses"
    is_loss = True

    def infer(self, *losses):
        if not losses or any(s.shape != () for s in losses):
            raise ShapeError(f"expected scalar losses, got shapes {[s.shape for s in losses]}")
        return [Spec((), same_float(*losses))]

    def flops(self, ins, outs):
        return float(len(ins))

    def forward(self, ctx, ins, outs, ws):
        outs[0][...] = sum(float(x) for x in ins) / len(ins)

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        g = _upstream(ctx, gouts) / len(gins)
        for gx in gins:
            if gx is not None:
                gx[...] = g


def cross_entropy(logits, labels):
    return apply(CrossEntropyOp(), logits, labels)


def mse_loss(pred, target):
    return apply(MSEOp(), pred, target)
