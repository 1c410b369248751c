"""Pointwise activations; each backward reads the one tensor it needs (GELU and SiLU recompute the rest
from x in their workspace)."""
from __future__ import annotations

import math

from scipy.special import erf

from ..graph import Spec
from .base import Op, apply, carve, nbytes_of


def _sigmoid(xp, x, y):
    xp.negative(x, out=y)
    xp.exp(y, out=y)
    y += 1
    xp.reciprocal(y, out=y)


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
        _sigmoid(ctx.xp, ins[0], outs[0])

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


class GELUOp(_Pointwise):
    """PyTorch's GELU: ``x * Phi(x)`` with the normal CDF Phi through ``erf`` (``approximate="none"``),
    or its tanh approximation ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``. The backward
    reads x and recomputes what it needs from it in its workspace. ``erf`` is SciPy's ufunc, which
    CuPy arrays dispatch to ``cupyx.scipy.special.erf``."""

    name = "gelu"
    saved_inputs = (0,)
    flops_per_output = 10
    K = math.sqrt(2.0 / math.pi)
    C = 0.044715

    def __init__(self, approximate="none"):
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate
        if approximate == "tanh":
            self.name = "gelu_tanh"

    def _scratch(self, x):
        return [(x.shape, x.dtype)] * (2 if self.approximate == "tanh" else 1)

    def backward_workspace(self, ins, outs):
        return nbytes_of(self._scratch(ins[0]))

    def _tanh_inner(self, xp, x, out):
        """``tanh(sqrt(2/pi) (x + 0.044715 x^3))`` into ``out``."""
        t = out.dtype.type
        xp.multiply(x, x, out=out)
        out *= t(self.C)
        out += 1
        out *= x
        out *= t(self.K)
        xp.tanh(out, out=out)

    def forward(self, ctx, ins, outs, ws):
        xp = ctx.xp
        x, y = ins[0], outs[0]
        if self.approximate == "tanh":
            self._tanh_inner(xp, x, y)
        else:
            xp.multiply(x, y.dtype.type(1 / math.sqrt(2.0)), out=y)
            erf(y, out=y)
        y += 1
        y *= y.dtype.type(0.5)
        y *= x

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp = ctx.xp
        x, gx = ins[0], gins[0]
        t = gx.dtype.type
        if self.approximate == "tanh":
            # 0.5 (1 + th) + 0.5 x (1 - th^2) K (1 + 3 C x^2), th the forward's tanh
            th, a = carve(ws, self._scratch(x))
            self._tanh_inner(xp, x, th)
            xp.multiply(x, x, out=a)
            a *= t(3 * self.C)
            a += 1
            a *= x
            a *= t(0.5 * self.K)
            xp.multiply(th, th, out=gx)
            xp.subtract(1, gx, out=gx)
            gx *= a
            th += 1
            th *= t(0.5)
            gx += th
        else:
            # Phi(x) + x phi(x)
            (a,) = carve(ws, self._scratch(x))
            xp.multiply(x, x, out=a)
            a *= t(-0.5)
            xp.exp(a, out=a)
            a *= x
            a *= t(1 / math.sqrt(2.0 * math.pi))
            xp.multiply(x, t(1 / math.sqrt(2.0)), out=gx)
            erf(gx, out=gx)
            gx += 1
            gx *= t(0.5)
            gx += a
        gx *= gouts[0]


class SiLUOp(_Pointwise):
    """``x * sigmoid(x)``; the backward reads x and recomputes the sigmoid in its workspace."""

    name = "silu"
    saved_inputs = (0,)
    flops_per_output = 5

    def backward_workspace(self, ins, outs):
        return nbytes_of([(ins[0].shape, ins[0].dtype)])

    def forward(self, ctx, ins, outs, ws):
        _sigmoid(ctx.xp, ins[0], outs[0])
        outs[0] *= ins[0]

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp = ctx.xp
        x, gx = ins[0], gins[0]
        (s,) = carve(ws, [(x.shape, x.dtype)])
        _sigmoid(xp, x, s)
        xp.subtract(1, s, out=gx)              # s (1 + x (1 - s))
        gx *= x
        gx += 1
        gx *= s
        gx *= gouts[0]


def gelu(x, approximate="none"):
    return apply(GELUOp(approximate), x)


def silu(x):
    return apply(SiLUOp(), x)
