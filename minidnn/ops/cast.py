"""A dtype conversion inserted by the graph (minidnn.autocast), never by the user.

The forward rounds to nearest even (NumPy's float16 and ml_dtypes' bfloat16 casts, as PyTorch's);
the backward converts the gradient back to the input's dtype, adding into it where a later
consumer made it first (a weight cast feeding a gradient accumulated over sub-batches). A value
beyond float16's range becomes inf without a warning: under fp16 that is the loss scaler's to see."""
from __future__ import annotations

import numpy as np

from ..graph import Spec
from .base import Op


class CastOp(Op):
    accumulating_inputs = (0,)

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)
        self.name = f"cast_{self.dtype.name}"

    def infer(self, x):
        return [Spec(x.shape, self.dtype)]

    def flops(self, ins, outs):
        return 0.0

    def forward(self, ctx, ins, outs, ws):
        with np.errstate(over="ignore"):
            ctx.xp.copyto(outs[0], ins[0], casting="unsafe")

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        with np.errstate(over="ignore"):
            if 0 in ctx.accumulate:
                ctx.xp.add(gins[0], gouts[0], out=gins[0], casting="unsafe")
            else:
                ctx.xp.copyto(gins[0], gouts[0], casting="unsafe")
