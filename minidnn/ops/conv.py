"""2-D convolution and transposed convolution.

Layouts are PyTorch's: x (N, C, H, W), weight (O, C/groups, kh, kw) for Conv2d
and (C, O/groups, kh, kw) for ConvTranspose2d. The default algorithm folds the
batch into the GEMM's columns (cols is (C*kh*kw, N*OH*OW)), so each pass is
one large GEMM per group; the column matrix and the channel-major output live
in the op's workspace, which the planner places in the arena like any other
buffer. Other algorithms (:mod:`.conv_algos`) trade workspace for speed; the
executor names one in ``ctx.algo`` (None: the default), and
:meth:`Conv2dOp.algorithms` lists them with their workspace.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..graph import Spec
from . import conv_algos
from .base import Algo, Op, apply, carve, nbytes_of, same_float


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _conv(ctx):
    """The backend's convolution algorithms; the CPU's for a context that names none."""
    return getattr(ctx, "conv", None) or conv_algos


def conv_out_size(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


class Conv2dOp(Op):
    name = "conv2d"
    saved_inputs = (0, 1)

    def __init__(self, stride=1, padding=0, dilation=1, groups=1):
        self.stride, self.padding, self.dilation = _pair(stride), _pair(padding), _pair(dilation)
        self.groups = groups

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

    def workspace(self, ins, outs):
        """The default algorithm's (whole-batch im2col) workspace; see :meth:`algorithms`."""
        return conv_algos.workspace(conv_algos.Geom.of(self, ins[0], ins[1], outs[0]), conv_algos.DEFAULT, "forward")

    def backward_workspace(self, ins, outs):
        return conv_algos.workspace(conv_algos.Geom.of(self, ins[0], ins[1], outs[0]), conv_algos.DEFAULT, "backward")

    def flops(self, ins, outs):
        o, cg, kh, kw = ins[1].shape
        return 2.0 * np.prod(outs[0].shape) * cg * kh * kw

    def algorithms(self, in_specs, out_specs, pass_) -> list:
        """The algorithms that apply to this layer for ``pass_`` ("forward" or
        "backward"), each with the workspace its step needs; the default first."""
        return conv_algos.algorithms(conv_algos.Geom.of(self, in_specs[0], in_specs[1], out_specs[0]), pass_)

    def forward(self, ctx, ins, outs, ws):
        b = ins[2] if len(ins) > 2 else None
        _conv(ctx).forward(self, ctx.k, ins[0], ins[1], b, outs[0], ws, getattr(ctx, "algo", None))

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        gb = gins[2] if len(gins) > 2 else None
        _conv(ctx).backward(self, ctx.k, ins[0], ins[1], gouts[0], gins[0], gins[1], gb, ws,
                            getattr(ctx, "algo", None))


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

    def algorithms(self, in_specs, out_specs, pass_) -> list:
        """"im2col" (the default) and "direct" (no workspace), for either pass."""
        if pass_ not in ("forward", "backward"):
            raise ValueError(f"pass must be 'forward' or 'backward', got {pass_!r}")
        return [Algo("im2col", self.workspace(in_specs, out_specs)), Algo("direct", 0, 2.5)]

    def _algo(self, ctx):
        name = getattr(ctx, "algo", None) or "im2col"
        if name not in ("im2col", "direct"):
            raise ValueError(f"unknown algorithm {name!r} for conv_transpose2d (im2col, direct)")
        return name

    # The transposed convolution's forward is Conv2d's backward-data, its
    # backward-data Conv2d's forward, its filter gradient Conv2d's with x and gy swapped.
    def _conv_args(self):
        return (*self.stride, *self.padding, *self.dilation, self.groups)

    def forward(self, ctx, ins, outs, ws):
        x, w = ins[0], ins[1]
        y = outs[0]
        own = getattr(_conv(ctx), "transpose_forward", None)   # a backend with its own (cuDNN)
        if own is not None:
            own(self, ctx.k, x, w, ins[2] if len(ins) > 2 else None, y, ws)
            return
        if self._algo(ctx) == "direct":
            ctx.k.conv2d_direct_backward_data(x, w, y, *self._conv_args())
            if len(ins) > 2:
                ctx.k.conv2d_add_bias(y, ins[2])
            return
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
        own = getattr(_conv(ctx), "transpose_backward", None)
        if own is not None:
            own(self, ctx.k, x, w, gy, gins[0], gins[1], gins[2] if len(gins) > 2 else None, ws)
            return
        if self._algo(ctx) == "direct":
            if len(gins) > 2 and gins[2] is not None:
                ctx.k.conv2d_bias_grad(gy, gins[2])
            if gins[1] is not None:
                ctx.k.conv2d_direct_backward_filter(gy, x, gins[1], *self._conv_args())
            if gins[0] is not None:
                ctx.k.conv2d_direct_forward(gy, w, None, gins[0], *self._conv_args())
            return
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
