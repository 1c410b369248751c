"""Fully connected layer: y = x @ W.T + b, weight (out, in) as in PyTorch."""
from __future__ import annotations

import numpy as np
from scipy.linalg import blas

from ..errors import ShapeError
from ..graph import Spec
from .base import Op, apply, same_float


def _gemm_acc(x, gy, gw):
    """gw += gy.T @ x in place (BLAS with beta = 1: no temporary the size of the weight)."""
    gemm = blas.sgemm if gw.dtype == np.float32 else blas.dgemm
    gemm(1.0, x.T, gy.T, beta=1.0, c=gw.T, trans_b=1, overwrite_c=1)


class LinearOp(Op):
    name = "linear"
    saved_inputs = (0, 1)
    accumulating_inputs = (1, 2)

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
        xp = ctx.xp
        xp.matmul(ins[0], ins[1].T, out=outs[0])
        if len(ins) > 2:
            outs[0] += ins[2]

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp = ctx.xp
        x, w = ins[0], ins[1]
        gy = gouts[0]
        if gins[0] is not None:
            xp.matmul(gy, w, out=gins[0])
        if gins[1] is not None:
            if 1 in ctx.accumulate:   # a backend's own GEMM with beta = 1 (cuBLAS), else BLAS's
                getattr(ctx.k, "gemm_acc", _gemm_acc)(x, gy, gins[1])
            else:
                xp.matmul(gy.T, x, out=gins[1])
        if len(gins) > 2 and gins[2] is not None:
            if 2 in ctx.accumulate:
                gins[2] += gy.sum(axis=0)
            else:
                xp.sum(gy, axis=0, out=gins[2])


def linear(x, weight, bias=None):
    return apply(LinearOp(), x, weight) if bias is None else apply(LinearOp(), x, weight, bias)
