"""Fully connected layer: y = x @ W.T + b, weight (out, in) as in PyTorch."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..graph import Spec
from .base import Op, apply, same_float


class LinearOp(Op):
    name = "linear"
    saved_inputs = (0, 1)

    def infer(self, x, w, b=None):
        dt = same_float(x, w, *([b] if b is not None else []))
        if len(x.shape) != 2:
            raise ShapeError(f"expected a 2-D input (N, features), got shape {x.shape}; add a Flatten")
        if x.shape[1] != w.shape[1]:
            raise ShapeError(f"expected {w.shape[1]} input features, got {x.shape[1]}")
        return [Spec((x.shape[0], w.shape[0]), dt)]

    def flops(self, ins, outs):
        return 2.0 * ins[0].shape[0] * ins[1].shape[0] * ins[1].shape[1]

    def forward(self, ctx, ins, outs, ws):
        np.matmul(ins[0], ins[1].T, out=outs[0])
        if len(ins) > 2:
            outs[0] += ins[2]

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        x, w = ins[0], ins[1]
        gy = gouts[0]
        if gins[0] is not None:
            np.matmul(gy, w, out=gins[0])
        if gins[1] is not None:
            np.matmul(gy.T, x, out=gins[1])
        if len(gins) > 2 and gins[2] is not None:
            np.sum(gy, axis=0, out=gins[2])


def linear(x, weight, bias=None):
    return apply(LinearOp(), x, weight) if bias is None else apply(LinearOp(), x, weight, bias)
