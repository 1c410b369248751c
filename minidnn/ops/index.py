"""Basic indexing of traced values, as PyTorch's ``x[:, 1:3]``, ``x[..., ::2]``, ``x[:, 0]``, ``x[:, None]``.

The key is ints, slices with positive steps, one ``...`` and ``None``: the
result is a strided view of x, so the forward copies that view into the output
and the backward writes the output gradient back into the same view of a
zeroed input gradient. Neither reads a tensor of the forward.

The batch dimension (0) is taken whole: samples stay independent, which
sub-batching relies on (a sub-batch would select other samples than the
whole batch). Advanced indexing (lists, arrays, tensors, booleans) is not
supported; :func:`parse` says which item is at fault.
"""
from __future__ import annotations

import numbers
import operator

from ..errors import ShapeError
from ..graph import Spec
from .base import Op, apply


class UnsupportedIndex(Exception):
    """An index that basic indexing of a traced value does not take (graph.py turns it into a
    TracingError naming the module path)."""


def _describe(item):
    if isinstance(item, bool):
        return "a bool (a boolean mask)"
    return f"a {type(item).__name__} (advanced indexing)"


def _index(v, what):
    if v is None:
        return None
    if isinstance(v, bool):
        raise UnsupportedIndex(f"a bool as a slice {what}")
    try:
        return operator.index(v)
    except TypeError:
        raise UnsupportedIndex(f"a {type(v).__name__} as a slice {what} (slices take ints)") from None


def parse(index, ndim):
    """``index`` as one item per output position: ints and slices (of the input dimensions in
    order, every dimension covered) and None (a new dimension of 1)."""
    items = index if isinstance(index, tuple) else (index,)
    out = []
    for item in items:
        if item is None or item is Ellipsis:
            out.append(item)
        elif isinstance(item, slice):
            step = _index(item.step, "step")
            if step is not None and step <= 0:
                raise UnsupportedIndex(f"a slice step of {step} (steps are positive, as in PyTorch)")
            out.append(slice(_index(item.start, "start"), _index(item.stop, "stop"), step))
        elif isinstance(item, bool) or not isinstance(item, numbers.Integral):
            raise UnsupportedIndex(_describe(item))
        else:
            out.append(operator.index(item))
    if out.count(Ellipsis) > 1:
        raise UnsupportedIndex("more than one '...'")
    used = sum(1 for i in out if i is not None and i is not Ellipsis)
    if used > ndim:
        raise UnsupportedIndex(f"{used} indices (too many for a {ndim}-d tensor)")
    fill = [slice(None)] * (ndim - used)
    if Ellipsis in out:
        k = out.index(Ellipsis)
        return out[:k] + fill + out[k + 1:]
    return out + fill


def keeps_batch(items, batch):
    """Whether the first output dimension is the whole first input dimension."""
    first = items[0]
    return isinstance(first, slice) and first.indices(batch) == (0, batch, 1)


class SliceOp(Op):
    """``x[key]`` for a key of :func:`parse` (ints, slices, None)."""

    name = "slice"

    def __init__(self, items):
        self.items = list(items)
        self.key = None              # normalized in infer, against the input's shape

    def infer(self, x):
        key, shape, d = [], [], 0
        for item in self.items:
            if item is None:
                key.append(None)
                shape.append(1)
                continue
            size = x.shape[d]
            if isinstance(item, slice):
                start, stop, step = item.indices(size)
                n = len(range(start, stop, step))
                if n == 0:
                    raise ShapeError(f"the slice {_show(item)} of dimension {d} (size {size}) selects nothing")
                key.append(slice(start, stop, step))
                shape.append(n)
            else:
                if not -size <= item < size:
                    raise ShapeError(f"index {item} is out of range for dimension {d} with size {size}")
                key.append(item % size)
            d += 1
        self.key = tuple(key)
        return [Spec(tuple(shape), x.dtype)]

    def flops(self, ins, outs):
        return 0.0

    def forward(self, ctx, ins, outs, ws):
        ctx.xp.copyto(outs[0], ins[0][self.key])

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        gx = gins[0]
        gx[...] = 0
        ctx.xp.copyto(gx[self.key], gouts[0])


def _show(s):
    parts = ["" if v is None else str(v) for v in (s.start, s.stop)]
    return ":".join(parts) + (f":{s.step}" if s.step not in (None, 1) else "")


def show(index):
    """``index`` as it was written between the brackets (``:, 1:3``, ``..., ::2``)."""
    items = index if isinstance(index, tuple) else (index,)
    return ", ".join(_show(i) if isinstance(i, slice) else "..." if i is Ellipsis else repr(i) for i in items)


def getitem(x, index):
    """``x[index]`` recorded as a :class:`SliceOp`; UnsupportedIndex for what basic indexing
    does not take, or for a key that selects samples."""
    if not x.shape:
        raise UnsupportedIndex("a 0-d tensor")
    items = parse(index, len(x.shape))
    if not keeps_batch(items, x.shape[0]):
        raise UnsupportedIndex("a selection along the batch dimension (samples stay independent: dim 0 "
                               "is taken whole, ':')")
    return apply(SliceOp(items), x)
