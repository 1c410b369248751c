"""Pointwise activations; each backward reads the one tensor it needs."""
from __future__ import annotations

from ..graph import Spec
from .base import Op, apply


class _Pointwise(Op):
    def infer(self, x):
        return [Spec(x.shape, x.dtype)]


class ReLUOp(_Pointwise):
    name = "relu"
    saved_outputs = (0,)

    def forward(self, ctx, ins, outs, ws):
        ctx.k.relu_forward(ins[0], outs[0])

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        ctx.k.relu_backward(outs[0], gouts[0], gins[0])


class LeakyReLUOp(_Pointwise):
    name = "leaky_relu"
    saved_inputs = (0,)

    def __init__(self, negative_slope=0.01):
        self.slope = negative_slope

    def forward(self, ctx, ins, outs, ws):
        xp = ctx.xp
        x, y = ins[0], outs[0]
        xp.multiply(x, y.dtype.type(self.slope), out=y)
        xp.copyto(y, x, where=x > 0)

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp = ctx.xp
        x, gy, gx = ins[0], gouts[0], gins[0]
        xp.multiply(gy, gx.dtype.type(self.slope), out=gx)
        xp.copyto(gx, gy, where=x > 0)


class SigmoidOp(_Pointwise):
    name = "sigmoid"
    saved_outputs = (0,)
    flops_per_output = 4

    def forward(self, ctx, ins, outs, ws):
        xp = ctx.xp
        y = outs[0]
        xp.negative(ins[0], out=y)
        xp.exp(y, out=y)
        y += 1
        xp.reciprocal(y, out=y)

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp = ctx.xp
        y, gx = outs[0], gins[0]
        xp.subtract(1, y, out=gx)
        gx *= y
        gx *= gouts[0]


class TanhOp(_Pointwise):
    name = "tanh"
    saved_outputs = (0,)
    flops_per_output = 4

    def forward(self, ctx, ins, outs, ws):
        xp = ctx.xp
        xp.tanh(ins[0], out=outs[0])

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp = ctx.xp
        y, gx = outs[0], gins[0]
        xp.multiply(y, y, out=gx)
        xp.subtract(1, gx, out=gx)
        gx *= gouts[0]


def relu(x):
    return apply(ReLUOp(), x)


def leaky_relu(x, negative_slope=0.01):
    return apply(LeakyReLUOp(negative_slope), x)


def sigmoid(x):
    return apply(SigmoidOp(), x)


def tanh(x):
    return apply(TanhOp(), x)
