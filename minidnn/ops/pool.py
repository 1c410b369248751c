"""Max, average, global-average and adaptive pooling (PyTorch semantics, ceil_mode=False)."""
from __future__ import annotations

import operator

import numpy as np

from ..errors import ShapeError
from ..graph import Spec
from .base import Op, apply
from .conv import _pair, conv_out_size


def _four_d(x):
    if len(x.shape) != 4:
        raise ShapeError(f"expected a 4-D input (N, C, H, W), got {len(x.shape)}-D")


class _Pool(Op):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1):
        self.kernel = _pair(kernel_size)
        self.stride = _pair(stride if stride is not None else kernel_size)
        self.padding, self.dilation = _pair(padding), _pair(dilation)
        if any(2 * p > k for p, k in zip(self.padding, self.kernel)):
            raise ShapeError(f"padding {self.padding} must be at most half the kernel {self.kernel}")

    def infer(self, x):
        _four_d(x)
        n, c, h, w = x.shape
        oh = conv_out_size(h, self.kernel[0], self.stride[0], self.padding[0], self.dilation[0])
        ow = conv_out_size(w, self.kernel[1], self.stride[1], self.padding[1], self.dilation[1])
        if oh < 1 or ow < 1:
            raise ShapeError(f"input {h}x{w} is smaller than the pooling window {self.kernel}")
        return [Spec((n, c, oh, ow), x.dtype)]

    def flops(self, ins, outs):
        return float(np.prod(outs[0].shape)) * self.kernel[0] * self.kernel[1]


class MaxPool2dOp(_Pool):
    """The backward recomputes each window's argmax from x: no index buffer is kept."""

    name = "max_pool2d"
    saved_inputs = (0,)

    def _g(self):
        return (*self.kernel, *self.stride, *self.padding, *self.dilation)

    def forward(self, ctx, ins, outs, ws):
        ctx.k.maxpool2d_forward(ins[0], outs[0], *self._g())

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        ctx.k.maxpool2d_backward(ins[0], gouts[0], gins[0], *self._g())


class AvgPool2dOp(_Pool):
    name = "avg_pool2d"

    def __init__(self, kernel_size, stride=None, padding=0, count_include_pad=True):
        super().__init__(kernel_size, stride, padding)
        self.count_include_pad = count_include_pad

    def _g(self):
        return (*self.kernel, *self.stride, *self.padding, self.count_include_pad)

    def forward(self, ctx, ins, outs, ws):
        ctx.k.avgpool2d_forward(ins[0], outs[0], *self._g())

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        ctx.k.avgpool2d_backward(gouts[0], gins[0], *self._g())


class GlobalAvgPoolOp(Op):
    """AdaptiveAvgPool2d((1, 1)): the mean over H and W."""

    name = "global_avg_pool"

    def infer(self, x):
        _four_d(x)
        return [Spec((x.shape[0], x.shape[1], 1, 1), x.dtype)]

    def forward(self, ctx, ins, outs, ws):
        xp = ctx.xp
        xp.mean(ins[0], axis=(2, 3), keepdims=True, out=outs[0])

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp = ctx.xp
        gx = gins[0]
        xp.multiply(gouts[0], gx.dtype.type(1.0 / (gx.shape[2] * gx.shape[3])), out=gx)


def _positive_int(v):
    try:
        return not isinstance(v, bool) and operator.index(v) >= 1
    except TypeError:
        return False


def adaptive_size(output_size, layer):
    """``output_size`` of an adaptive pool as a pair of positive ints or None (None keeps that input
    dimension, as in PyTorch); ShapeError naming ``layer`` for anything else."""
    pair = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size, output_size)
    if output_size is None or len(pair) != 2 or not all(v is None or _positive_int(v) for v in pair):
        raise ShapeError(f"{layer}: output_size must be a positive int or a pair (h, w) of positive ints "
                         f"or None, got {output_size!r}")
    return tuple(None if v is None else operator.index(v) for v in pair)


def adaptive_windows(size, out):
    """PyTorch's adaptive windows over ``size`` pixels: (start, end) of each of ``out`` outputs,
    start = floor(i * size / out), end = ceil((i + 1) * size / out)."""
    return [(i * size // out, -(-(i + 1) * size // out)) for i in range(out)]


class _AdaptivePool(Op):
    """Each output pixel pools its own window (adjacent windows may overlap by a pixel); the
    output size comes from ``y`` in the kernels, so an op holds nothing but ``output_size``."""

    layer = "adaptive pool"

    def __init__(self, output_size):
        self.output_size = output_size   # checked in infer, so the error names the module path

    def infer(self, x):
        _four_d(x)
        n, c, h, w = x.shape
        if h < 1 or w < 1:
            raise ShapeError(f"{self.layer}: cannot pool an empty {h}x{w} input")
        oh, ow = adaptive_size(self.output_size, self.layer)
        return [Spec((n, c, oh or h, ow or w), x.dtype)]

    def flops(self, ins, outs):
        (n, c, h, w), (oh, ow) = ins[0].shape, outs[0].shape[2:]
        rows = sum(e - s for s, e in adaptive_windows(h, oh))
        cols = sum(e - s for s, e in adaptive_windows(w, ow))
        return float(n * c * rows * cols)


class AdaptiveAvgPool2dOp(_AdaptivePool):
    """The backward spreads each output gradient over its window: it reads no value, only shapes."""

    name = "adaptive_avg_pool2d"
    layer = "AdaptiveAvgPool2d"

    def forward(self, ctx, ins, outs, ws):
        ctx.k.adaptive_avgpool2d_forward(ins[0], outs[0])

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        ctx.k.adaptive_avgpool2d_backward(gouts[0], gins[0])


class AdaptiveMaxPool2dOp(_AdaptivePool):
    """The backward recomputes each window's argmax from x (the first maximum wins, as in
    PyTorch): x is kept, no index buffer."""

    name = "adaptive_max_pool2d"
    layer = "AdaptiveMaxPool2d"
    saved_inputs = (0,)

    def forward(self, ctx, ins, outs, ws):
        ctx.k.adaptive_maxpool2d_forward(ins[0], outs[0])

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        ctx.k.adaptive_maxpool2d_backward(ins[0], gouts[0], gins[0])


def _out_size(op, x):
    """(OH, OW) of ``op`` on ``x``, or None where its infer refuses (recording it then raises the
    error, naming the module path)."""
    try:
        return tuple(op.infer(x.spec)[0].shape[2:])
    except ShapeError:
        return None


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1):
    return apply(MaxPool2dOp(kernel_size, stride, padding, dilation), x)


def avg_pool2d(x, kernel_size, stride=None, padding=0, count_include_pad=True):
    return apply(AvgPool2dOp(kernel_size, stride, padding, count_include_pad), x)


def adaptive_avg_pool2d(x, output_size=(1, 1)):
    """The mean of each of PyTorch's adaptive windows (see :func:`adaptive_windows`); the default
    (1, 1) is the global average. Where the output size is the input's, every window is the pixel
    under it and the pool is the identity, bitwise: nothing is recorded (so a 224x224 VGG or AlexNet
    has the graph of a network without it)."""
    op = AdaptiveAvgPool2dOp(output_size)
    size = _out_size(op, x)
    if size == tuple(x.shape[2:]):
        return x
    return apply(GlobalAvgPoolOp() if size == (1, 1) else op, x)


def adaptive_max_pool2d(x, output_size):
    """The maximum of each of PyTorch's adaptive windows (the first one where several are equal);
    the identity, not recorded, where the output size is the input's."""
    op = AdaptiveMaxPool2dOp(output_size)
    return x if _out_size(op, x) == tuple(x.shape[2:]) else apply(op, x)
