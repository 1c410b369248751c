"""Joins of branches: add (residual connections) and channel concatenation."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..graph import Spec
from .base import Op, apply, same_float


class AddOp(Op):
    name = "add"

    def infer(self, a, b):
        dt = same_float(a, b)
        if a.shape != b.shape:
            raise ShapeError(f"cannot add shapes {a.shape} and {b.shape}")
        return [Spec(a.shape, dt)]

    def forward(self, ctx, ins, outs, ws):
        ctx.k.add(ins[0], ins[1], outs[0])

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        for g in gins:
            if g is not None:
                ctx.k.add(gouts[0], None, g)     # a copy


class CatOp(Op):
    name = "cat"

    def __init__(self, dim=1):
        self.dim = dim

    def infer(self, *xs):
        dt = same_float(*xs)
        ref = xs[0].shape
        d = self.dim % len(ref)
        for x in xs[1:]:
            if len(x.shape) != len(ref) or any(a != b for i, (a, b) in enumerate(zip(ref, x.shape)) if i != d):
                raise ShapeError(f"cannot concatenate shapes {[x.shape for x in xs]} along dim {self.dim}")
        shape = list(ref)
        shape[d] = sum(x.shape[d] for x in xs)
        self._widths = [x.shape[d] for x in xs]
        return [Spec(tuple(shape), dt)]

    def forward(self, ctx, ins, outs, ws):
        xp = ctx.xp
        xp.concatenate(ins, axis=self.dim, out=outs[0])

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp = ctx.xp
        gy, start = gouts[0], 0
        d = self.dim % gy.ndim
        for g, x in zip(gins, self._widths):
            width = x
            if g is not None:
                xp.copyto(g, gy[(slice(None),) * d + (slice(start, start + width),)])
            start += width


class ReshapeOp(Op):
    name = "reshape"

    def __init__(self, shape):
        self.shape = tuple(shape)

    def infer(self, x):
        if int(np.prod(self.shape)) != int(np.prod(x.shape)):
            raise ShapeError(f"cannot reshape {x.shape} to {self.shape}")
        return [Spec(self.shape, x.dtype)]

    def flops(self, ins, outs):
        return 0.0

    def forward(self, ctx, ins, outs, ws):
        xp = ctx.xp
        xp.copyto(outs[0], ins[0].reshape(self.shape))

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp = ctx.xp
        xp.copyto(gins[0], gouts[0].reshape(gins[0].shape))


def add(a, b):
    return apply(AddOp(), a, b)


def cat(xs, dim=1):
    xs = list(xs)
    return xs[0] if len(xs) == 1 else apply(CatOp(dim), *xs)


def flatten(x, start_dim=1):
    shape = tuple(x.shape[:start_dim]) + (int(np.prod(x.shape[start_dim:])),)
    return apply(ReshapeOp(shape), x)


def reshape(x, shape):
    return apply(ReshapeOp(shape), x)
