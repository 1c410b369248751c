"""Normalizations within each sample: LayerNorm and GroupNorm (PyTorch's semantics).

Both normalize rows of a reshaped view of x - LayerNorm the trailing
``normalized_shape`` of each leading index, GroupNorm each (sample, group) of
channels - and then apply an affine map, per element of ``normalized_shape``
(LayerNorm) or per channel (GroupNorm). The forward writes each row's mean and
inverse std as two small extra outputs, shaped by the leading dimensions so the
batch stays first; the backward reads them with x and gamma, and rebuilds the
normalized x in its workspace. Rows never mix samples, so a mini-batch split
into sub-batches gives the same bits.

The backward, with xhat = (x - mean) * invstd and g = gy * gamma, per row of D
values: gx = invstd * (g - mean(g) - xhat * mean(g * xhat)); d gamma and d beta
are the sums of gy * xhat and gy over everything but the affine dimension.
"""
from __future__ import annotations

import math
import numbers

from ..errors import ShapeError
from ..graph import Spec
from .base import Op, apply, carve, nbytes_of, same_float


class _RowNormOp(Op):
    """x viewed as (rows, D) is normalized per row; the affine parameters (``has_weight``,
    ``has_bias``: inputs 1 and 2, or 1 alone) act on x viewed as (A, P, B), one per P."""

    saved_outputs = (1, 2)
    flops_per_output = 8

    def __init__(self, eps, has_weight, has_bias):
        self.eps, self.has_weight, self.has_bias = float(eps), bool(has_weight), bool(has_bias)
        self.saved_inputs = (0, 1) if has_weight else (0,)

    # subclasses: the views of x and the statistics' shape
    def _rows(self, shape) -> tuple:
        raise NotImplementedError

    def _affine(self, shape) -> tuple:
        raise NotImplementedError

    def _stats_shape(self, shape) -> tuple:
        raise NotImplementedError

    def _check(self, x, params):
        raise NotImplementedError

    def infer(self, x, *params):
        if len(params) != self.has_weight + self.has_bias:
            raise ShapeError(f"expected {self.has_weight + self.has_bias} affine parameters, got {len(params)}")
        dt = same_float(x, *params)
        self._check(x, params)
        stats = Spec(self._stats_shape(x.shape), dt)
        return [Spec(x.shape, dt), stats, stats]

    def backward_workspace(self, ins, outs):
        return nbytes_of([(self._rows(ins[0].shape), ins[0].dtype)])

    def _param_view(self, p, shape):
        return p.reshape(1, self._affine(shape)[1], 1)

    def forward(self, ctx, ins, outs, ws):
        xp = ctx.xp
        x, y, mean, invstd = ins[0], outs[0], outs[1], outs[2]
        rows = self._rows(x.shape)
        xr, yr = x.reshape(rows), y.reshape(rows)
        m, s = mean.reshape(-1), invstd.reshape(-1)
        t = y.dtype.type
        xp.mean(xr, axis=1, out=m)
        xp.subtract(xr, m[:, None], out=yr)                 # x - mean, then xhat, then y
        s[...] = xp.einsum("rd,rd->r", yr, yr)               # sum of squared deviations: two passes
        s *= t(1.0 / rows[1])
        s += t(self.eps)
        xp.sqrt(s, out=s)
        xp.reciprocal(s, out=s)
        yr *= s[:, None]
        ya = y.reshape(self._affine(x.shape))
        if self.has_weight:
            ya *= self._param_view(ins[1], x.shape)
        if self.has_bias:
            ya += self._param_view(ins[1 + self.has_weight], x.shape)

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp = ctx.xp
        x, gy, gx = ins[0], gouts[0], gins[0]
        rows, affine = self._rows(x.shape), self._affine(x.shape)
        m, s = outs[1].reshape(-1), outs[2].reshape(-1)
        (xhat,) = carve(ws, [(rows, x.dtype)])
        xp.subtract(x.reshape(rows), m[:, None], out=xhat)
        xhat *= s[:, None]
        gya, xhata = gy.reshape(affine), xhat.reshape(affine)
        gw = gins[1] if self.has_weight else None
        gb = gins[1 + self.has_weight] if self.has_bias else None
        if gw is not None:
            gw[...] = xp.einsum("apb,apb->p", gya, xhata).reshape(gw.shape)
        if gb is not None:
            gb[...] = gya.sum(axis=(0, 2)).reshape(gb.shape)
        if gx is None:
            return
        if self.has_weight:
            xp.multiply(gya, self._param_view(ins[1], x.shape), out=gx.reshape(affine))
        else:
            xp.copyto(gx, gy)
        gr = gx.reshape(rows)
        t = gx.dtype.type
        a = gr.mean(axis=1)                                  # mean(g) and mean(g * xhat), per row
        b = xp.einsum("rd,rd->r", gr, xhat)
        b *= t(1.0 / rows[1])
        xhat *= b[:, None]
        gr -= xhat
        gr -= a[:, None]
        gr *= s[:, None]


class LayerNormOp(_RowNormOp):
    """Normalizes over the last ``len(normalized_shape)`` dimensions of x."""

    name = "layer_norm"

    def __init__(self, normalized_shape, eps=1e-5, has_weight=True, has_bias=True):
        super().__init__(eps, has_weight, has_bias)
        self.normalized_shape = tuple(normalized_shape)

    def _lead(self, shape):
        return shape[:len(shape) - len(self.normalized_shape)]

    def _rows(self, shape):
        return (math.prod(self._lead(shape)), math.prod(self.normalized_shape))

    def _affine(self, shape):
        return self._rows(shape) + (1,)          # one weight per normalized element

    def _stats_shape(self, shape):
        return self._lead(shape)

    def _check(self, x, params):
        k = len(self.normalized_shape)
        if len(x.shape) < k or tuple(x.shape[len(x.shape) - k:]) != self.normalized_shape:
            raise ShapeError(f"expected an input of shape (*, {', '.join(map(str, self.normalized_shape))}) "
                             f"(normalized_shape {list(self.normalized_shape)}), got {x.shape}")
        for p in params:
            if tuple(p.shape) != self.normalized_shape:
                raise ShapeError(f"expected weight and bias of shape {self.normalized_shape}, got {p.shape}")


class GroupNormOp(_RowNormOp):
    """Normalizes each group of ``C / num_groups`` channels of each sample (x is (N, C, *))."""

    name = "group_norm"

    def __init__(self, num_groups, eps=1e-5, has_weight=True, has_bias=True):
        super().__init__(eps, has_weight, has_bias)
        self.num_groups = int(num_groups)

    def _rows(self, shape):
        return (shape[0] * self.num_groups, math.prod(shape[1:]) // self.num_groups)

    def _affine(self, shape):
        return (shape[0], shape[1], math.prod(shape[2:]))

    def _stats_shape(self, shape):
        return (shape[0], self.num_groups)

    def _check(self, x, params):
        if len(x.shape) < 2:
            raise ShapeError(f"expected an input of shape (N, C, *), got {len(x.shape)}-D")
        c = x.shape[1]
        for p in params:
            if tuple(p.shape) != (c,):
                raise ShapeError(f"expected {p.shape[0] if p.shape else 1} channels, got {c}")
        if self.num_groups < 1 or c % self.num_groups:
            raise ShapeError(f"{c} channels cannot be split into {self.num_groups} groups")


def _params(weight, bias):
    return [p for p in (weight, bias) if p is not None]


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """As ``torch.nn.functional.layer_norm``."""
    if isinstance(normalized_shape, numbers.Integral):
        normalized_shape = (normalized_shape,)
    op = LayerNormOp(normalized_shape, eps, weight is not None, bias is not None)
    return apply(op, x, *_params(weight, bias))[0]


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    """As ``torch.nn.functional.group_norm``."""
    op = GroupNormOp(num_groups, eps, weight is not None, bias is not None)
    return apply(op, x, *_params(weight, bias))[0]
