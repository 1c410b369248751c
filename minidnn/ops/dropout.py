"""Dropout with an explicit mask output, so the backward reads a planned buffer."""
from __future__ import annotations

import numpy as np

from ..graph import Spec
from .base import Op, apply, carve, nbytes_of


class DropoutOp(Op):
    name = "dropout"
    saved_outputs = (1,)
    recomputable = False  # recomputing would draw a new mask

    def __init__(self, p=0.5):
        if not 0 <= p < 1:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def infer(self, x):
        return [Spec(x.shape, x.dtype), Spec(x.shape, np.dtype(np.uint8))]

    def _scratch(self, x):
        return [(x.shape, np.float32)]

    def workspace(self, ins, outs):
        return nbytes_of(self._scratch(ins[0]))

    def forward(self, ctx, ins, outs, ws):
        x, (y, mask) = ins[0], outs
        xp = ctx.xp
        (u,) = carve(ws, self._scratch(x))
        if xp is np:
            ctx.rng.random(dtype=np.float32, out=u)
        else:   # the host's generator on every backend: the same seed draws the same masks
            u[...] = xp.asarray(ctx.rng.random(u.shape, dtype=np.float32))
        xp.greater_equal(u, self.p, out=mask.view(np.bool_))
        xp.multiply(x, mask, out=y)
        y *= y.dtype.type(1.0 / (1.0 - self.p))

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        gx = gins[0]
        ctx.xp.multiply(gouts[0], outs[1], out=gx)
        gx *= gx.dtype.type(1.0 / (1.0 - self.p))


def dropout(x, p=0.5):
    return apply(DropoutOp(p), x)[0]
