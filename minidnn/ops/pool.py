"""Max, average and global-average pooling (PyTorch semantics, ceil_mode=False)."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..graph import Spec
from .base import Op, apply
from .conv import _pair, conv_out_size


class _Pool(Op):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1):
        self.kernel = _pair(kernel_size)
        self.stride = _pair(stride if stride is not None else kernel_size)
        self.padding, self.dilation = _pair(padding), _pair(dilation)
        if any(2 * p > k for p, k in zip(self.padding, self.kernel)):
            raise ShapeError(f"padding {self.padding} must be at most half the kernel {self.kernel}")

    def infer(self, x):
        if len(x.shape) != 4:
            raise ShapeError(f"expected a 4-D input (N, C, H, W), got {len(x.shape)}-D")
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
        if len(x.shape) != 4:
            raise ShapeError(f"expected a 4-D input (N, C, H, W), got {len(x.shape)}-D")
        return [Spec((x.shape[0], x.shape[1], 1, 1), x.dtype)]

    def forward(self, ctx, ins, outs, ws):
        xp = ctx.xp
        xp.mean(ins[0], axis=(2, 3), keepdims=True, out=outs[0])

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp = ctx.xp
        gx = gins[0]
        xp.multiply(gouts[0], gx.dtype.type(1.0 / (gx.shape[2] * gx.shape[3])), out=gx)


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1):
    return apply(MaxPool2dOp(kernel_size, stride, padding, dilation), x)


def avg_pool2d(x, kernel_size, stride=None, padding=0, count_include_pad=True):
    return apply(AvgPool2dOp(kernel_size, stride, padding, count_include_pad), x)


def adaptive_avg_pool2d(x, output_size=(1, 1)):
    if _pair(output_size) != (1, 1):
        raise ShapeError(f"adaptive_avg_pool2d supports output_size (1, 1) only, got {output_size}")
    return apply(GlobalAvgPoolOp(), x)
