"""2-D convolution and transposed convolution: im2col + one GEMM over the batch.

Layouts are PyTorch's: x (N, C, H, W), weight (O, C/groups, kh, kw) for Conv2d
and (C, O/groups, kh, kw) for ConvTranspose2d. The batch is folded into the
GEMM's columns (cols is (C*kh*kw, N*OH*OW)), so each pass is one large GEMM
per group; the column matrix and the channel-major output live in the op's
workspace, which the planner places in the arena like any other buffer.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..graph import Spec
from .base import Op, apply, carve, nbytes_of, same_float


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def conv_out_size(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


class Conv2dOp(Op):
    name = "conv2d"
    saved_inputs = (0, 1)

    def __init__(self, stride=1, padding=0, dilation=1, groups=1):
        self.stride, self.padding, self.dilation = _pair(stride), _pair(padding), _pair(dilation)
        self.groups = groups

    def _geom(self, x, w):
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = w.shape[2:], self.stride, self.padding, self.dilation
        return kh, kw, sh, sw, ph, pw, dh, dw

    def infer(self, x, w, b=None):
        dt = same_float(x, w, *([b] if b is not None else []))
        if len(x.shape) != 4:
            raise ShapeError(f"expected a 4-D input (N, C, H, W), got {len(x.shape)}-D")
        n, c, h, wd = x.shape
        o, cg, kh, kw = w.shape
        if c != cg * self.groups:
            raise ShapeError(f"expected {cg * self.groups} input channels, got {c}")
        if o % self.groups:
            raise ShapeError(f"out_channels {o} not divisible by groups {self.groups}")
        if b is not None and b.shape != (o,):
            raise ShapeError(f"bias shape {b.shape} != ({o},)")
        oh = conv_out_size(h, kh, self.stride[0], self.padding[0], self.dilation[0])
        ow = conv_out_size(wd, kw, self.stride[1], self.padding[1], self.dilation[1])
        if oh < 1 or ow < 1:
            raise ShapeError(f"input {h}x{wd} is too small for kernel {kh}x{kw} "
                             f"(padding {self.padding}, dilation {self.dilation})")
        return [Spec((n, o, oh, ow), dt)]

    def _scratch(self, x, w, y):
        n, c = x.shape[:2]
        o, cg, kh, kw = w.shape
        l = y.shape[2] * y.shape[3]
        return [((c * kh * kw, n * l), x.dtype), ((o, n * l), x.dtype)]

    def workspace(self, ins, outs):
        return nbytes_of(self._scratch(ins[0], ins[1], outs[0]))

    backward_workspace = workspace

    def flops(self, ins, outs):
        o, cg, kh, kw = ins[1].shape
        return 2.0 * np.prod(outs[0].shape) * cg * kh * kw

    def forward(self, ctx, ins, outs, ws):
        x, w = ins[0], ins[1]
        y = outs[0]
        g = self.groups
        cols, yt = carve(ws, self._scratch(x, w, y))
        ctx.k.im2col(x, cols, *self._geom(x, w))
        o = w.shape[0]
        np.matmul(w.reshape(g, o // g, -1), cols.reshape(g, cols.shape[0] // g, -1),
                  out=yt.reshape(g, o // g, -1))
        ctx.k.cn_to_nchw(yt, y, False)
        if len(ins) > 2:
            y += ins[2].reshape(1, -1, 1, 1)

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        x, w = ins[0], ins[1]
        gy = gouts[0]
        g = self.groups
        o = w.shape[0]
        cols, gyt = carve(ws, self._scratch(x, w, gy))
        ctx.k.nchw_to_cn(gy, gyt)
        gyt3 = gyt.reshape(g, o // g, -1)
        if len(gins) > 2 and gins[2] is not None:
            np.sum(gyt, axis=1, out=gins[2])
        if gins[1] is not None:
            ctx.k.im2col(x, cols, *self._geom(x, w))
            cols3 = cols.reshape(g, cols.shape[0] // g, -1)
            np.matmul(gyt3, cols3.transpose(0, 2, 1), out=gins[1].reshape(g, o // g, -1))
        if gins[0] is not None:
            w3 = w.reshape(g, o // g, -1)
            np.matmul(w3.transpose(0, 2, 1), gyt3, out=cols.reshape(g, cols.shape[0] // g, -1))
            ctx.k.col2im(cols, gins[0], *self._geom(x, w))


class ConvTranspose2dOp(Op):
    """The adjoint of Conv2d: its forward is Conv2d's backward-data."""

    name = "conv_transpose2d"
    saved_inputs = (0, 1)

    def __init__(self, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
        self.stride, self.padding = _pair(stride), _pair(padding)
        self.output_padding, self.dilation = _pair(output_padding), _pair(dilation)
        self.groups = groups

    def _geom(self, w):
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = w.shape[2:], self.stride, self.padding, self.dilation
        return kh, kw, sh, sw, ph, pw, dh, dw

    def infer(self, x, w, b=None):
        dt = same_float(x, w, *([b] if b is not None else []))
        if len(x.shape) != 4:
            raise ShapeError(f"expected a 4-D input (N, C, H, W), got {len(x.shape)}-D")
        n, c, h, wd = x.shape
        ci, og, kh, kw = w.shape
        if c != ci:
            raise ShapeError(f"expected {ci} input channels, got {c}")
        o = og * self.groups
        if b is not None and b.shape != (o,):
            raise ShapeError(f"bias shape {b.shape} != ({o},)")
        size = []
        for i, (sz, k) in enumerate(((h, kh), (wd, kw))):
            size.append((sz - 1) * self.stride[i] - 2 * self.padding[i]
                        + self.dilation[i] * (k - 1) + self.output_padding[i] + 1)
        if min(size) < 1:
            raise ShapeError(f"output size {tuple(size)} is empty")
        return [Spec((n, o, size[0], size[1]), dt)]

    def _scratch(self, x, w, y):
        n, c, h, wd = x.shape
        ci, og, kh, kw = w.shape
        l = h * wd
        return [((og * self.groups * kh * kw, n * l), x.dtype), ((c, n * l), x.dtype)]

    def workspace(self, ins, outs):
        return nbytes_of(self._scratch(ins[0], ins[1], outs[0]))

    backward_workspace = workspace

    def flops(self, ins, outs):
        ci, og, kh, kw = ins[1].shape
        return 2.0 * np.prod(ins[0].shape) * og * kh * kw

    def forward(self, ctx, ins, outs, ws):
        x, w = ins[0], ins[1]
        y = outs[0]
        g = self.groups
        ci = w.shape[0]
        cols, xt = carve(ws, self._scratch(x, w, y))
        ctx.k.nchw_to_cn(x, xt)
        w3 = w.reshape(g, ci // g, -1)  # (g, C/g, O/g*kh*kw)
        np.matmul(w3.transpose(0, 2, 1), xt.reshape(g, ci // g, -1),
                  out=cols.reshape(g, cols.shape[0] // g, -1))
        ctx.k.col2im(cols, y, *self._geom(w))
        if len(ins) > 2:
            y += ins[2].reshape(1, -1, 1, 1)

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        x, w = ins[0], ins[1]
        gy = gouts[0]
        g = self.groups
        ci = w.shape[0]
        cols, xt = carve(ws, self._scratch(x, w, gy))
        if len(gins) > 2 and gins[2] is not None:
            np.sum(gy, axis=(0, 2, 3), out=gins[2])
        ctx.k.im2col(gy, cols, *self._geom(w))
        cols3 = cols.reshape(g, cols.shape[0] // g, -1)
        if gins[1] is not None:
            ctx.k.nchw_to_cn(x, xt)
            np.matmul(xt.reshape(g, ci // g, -1), cols3.transpose(0, 2, 1),
                      out=gins[1].reshape(g, ci // g, -1))
        if gins[0] is not None:
            np.matmul(w.reshape(g, ci // g, -1), cols3, out=xt.reshape(g, ci // g, -1))
            ctx.k.cn_to_nchw(xt, gins[0], False)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    op = Conv2dOp(stride, padding, dilation, groups)
    return apply(op, x, weight) if bias is None else apply(op, x, weight, bias)


def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    op = ConvTranspose2dOp(stride, padding, output_padding, dilation, groups)
    return apply(op, x, weight) if bias is None else apply(op, x, weight, bias)
