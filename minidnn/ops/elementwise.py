"""Joins of branches: add (residual connections) and channel concatenation; reshapes; scalar affine."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..graph import Spec, find_graph
from ..precision import is_float
from .base import Op, apply, same_float


class AddOp(Op):
    name = "add"

    def infer(self, a, b):
        dt = same_float(a, b)
        if a.shape != b.shape:
            raise ShapeError(f"cannot add shapes {a.shape} and {b.shape}")
        return [Spec(a.shape, dt)]

    def forward(self, ctx, ins, outs, ws):
        ctx.k.add(ins[0], ins[1], outs[0])

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        for g in gins:
            if g is not None:
                ctx.k.add(gouts[0], None, g)     # a copy


class CatOp(Op):
    name = "cat"

    def __init__(self, dim=1):
        self.dim = dim

    def infer(self, *xs):
        dt = same_float(*xs)
        ref = xs[0].shape
        d = self.dim % len(ref)
        for x in xs[1:]:
            if len(x.shape) != len(ref) or any(a != b for i, (a, b) in enumerate(zip(ref, x.shape)) if i != d):
                raise ShapeError(f"cannot concatenate shapes {[x.shape for x in xs]} along dim {self.dim}")
        shape = list(ref)
        shape[d] = sum(x.shape[d] for x in xs)
        self._widths = [x.shape[d] for x in xs]
        return [Spec(tuple(shape), dt)]

    def forward(self, ctx, ins, outs, ws):
        xp = ctx.xp
        xp.concatenate(ins, axis=self.dim, out=outs[0])

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp = ctx.xp
        gy, start = gouts[0], 0
        d = self.dim % gy.ndim
        for g, x in zip(gins, self._widths):
            width = x
            if g is not None:
                xp.copyto(g, gy[(slice(None),) * d + (slice(start, start + width),)])
            start += width


class ReshapeOp(Op):
    """A copy of the input with another shape; ``shape`` may hold one -1, inferred from the input
    (PyTorch's ``view``/``reshape``)."""

    name = "reshape"

    def __init__(self, shape):
        self.requested = tuple(int(d) for d in shape)
        self.shape = self.requested

    def infer(self, x):
        self.shape = resolve_shape(self.requested, x.shape)
        return [Spec(self.shape, x.dtype)]

    def flops(self, ins, outs):
        return 0.0

    def forward(self, ctx, ins, outs, ws):
        xp = ctx.xp
        xp.copyto(outs[0], ins[0].reshape(self.shape))

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp = ctx.xp
        xp.copyto(gins[0], gouts[0].reshape(gins[0].shape))


def resolve_shape(shape, in_shape):
    """``shape`` with its -1 (at most one) replaced so that it holds as many elements as
    ``in_shape``; ShapeError where that cannot be."""
    n = int(np.prod(in_shape, dtype=np.int64))
    free = [i for i, d in enumerate(shape) if d == -1]
    if len(free) > 1:
        raise ShapeError(f"only one dimension can be -1, got shape {shape}")
    bad = [d for d in shape if d < -1]
    if bad:
        raise ShapeError(f"invalid dimension {bad[0]} in shape {shape}")
    known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
    if free:
        if known == 0 or n % known:
            raise ShapeError(f"cannot reshape {tuple(in_shape)} ({n} elements) to {shape}")
        shape = tuple(n // known if d == -1 else d for d in shape)
    elif known != n:
        raise ShapeError(f"cannot reshape {tuple(in_shape)} ({n} elements) to {shape}")
    return tuple(shape)


class ScalarAffineOp(Op):
    """``y = x * scale + shift`` for Python numbers ``scale`` and ``shift``: the tensor-and-scalar
    arithmetic of a ``forward`` (``y * 0.5``, ``y + 1``, ``y - 1``, ``y / 2``, ``1 - y``, ``-y``).
    The backward, ``gx = gy * scale``, reads no tensor of the forward."""

    def __init__(self, scale=1.0, shift=0.0):
        self.scale, self.shift = float(scale), float(shift)
        self.name = ("add_scalar" if self.scale == 1.0 else
                     "mul_scalar" if self.shift == 0.0 else "affine_scalar")

    def infer(self, x):
        if not is_float(x.dtype):
            raise ShapeError(f"scalar arithmetic needs a floating-point tensor, got {np.dtype(x.dtype).name}")
        return [Spec(x.shape, x.dtype)]

    def forward(self, ctx, ins, outs, ws):
        xp = ctx.xp
        x, y = ins[0], outs[0]
        t = y.dtype.type
        if self.scale == 1.0:
            xp.add(x, t(self.shift), out=y)
        else:
            xp.multiply(x, t(self.scale), out=y)
            if self.shift != 0.0:
                xp.add(y, t(self.shift), out=y)

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp = ctx.xp
        gx = gins[0]
        if self.scale == 1.0:
            xp.copyto(gx, gouts[0])
        else:
            xp.multiply(gouts[0], gx.dtype.type(self.scale), out=gx)


def add(a, b):
    return apply(AddOp(), a, b)


def cat(xs, dim=1):
    xs = list(xs)
    return xs[0] if len(xs) == 1 else apply(CatOp(dim), *xs)


def flatten(x, start_dim=1, end_dim=-1):
    """Dimensions ``start_dim`` to ``end_dim`` (inclusive, negative counts from the end) as one,
    as ``torch.flatten``."""
    shape = tuple(x.shape)
    if not shape:
        return apply(ReshapeOp((1,)), x)
    nd = len(shape)
    for d in (start_dim, end_dim):
        if not -nd <= d < nd:
            raise _traced_error(x, "flatten", f"dimension {d} out of range for a {nd}-d tensor {shape}")
    s, e = start_dim % nd, end_dim % nd
    if s > e:
        raise _traced_error(x, "flatten", f"start_dim ({start_dim}) comes after end_dim ({end_dim})")
    new = shape[:s] + (int(np.prod(shape[s:e + 1], dtype=np.int64)),) + shape[e + 1:]
    return apply(ReshapeOp(new), x)


def reshape(x, shape):
    """``x`` with ``shape`` (one -1 is inferred), as ``torch.reshape``."""
    return apply(ReshapeOp(shape), x)


def scalar_affine(x, scale=1.0, shift=0.0):
    """``x * scale + shift`` for Python numbers ``scale`` and ``shift``."""
    return apply(ScalarAffineOp(scale, shift), x)


def _traced_error(x, what, msg):
    g = find_graph(x)
    return ShapeError(f"{g.path or '<root>'} ({what}): {msg} [input shapes {tuple(x.shape)}]")
