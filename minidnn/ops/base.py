"""The op protocol: forward and backward side by side, over buffers handed in.

An op never allocates a tensor. The executor hands it views into the arena:
``ins`` and ``outs`` for the forward; for the backward, the inputs and outputs
it declared in ``saved_inputs``/``saved_outputs`` (the others are ``None``),
the output gradients ``gouts`` and the input-gradient buffers ``gins`` to
overwrite (``None`` where no gradient is wanted). Scratch memory comes as one
byte buffer ``ws`` of the size the op asked for, cut with :func:`carve`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import Spec, find_graph, as_value

from ..schedule import aligned as align


def nbytes_of(shapes_dtypes) -> int:
    """Bytes of a list of (shape, dtype) scratch arrays, each aligned."""
    return sum(align(int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize) for s, d in shapes_dtypes)


def carve(ws, shapes_dtypes):
    """Cut typed arrays out of the byte buffer ``ws`` (as :func:`nbytes_of` sized it)."""
    out, off = [], 0
    for shape, dtype in shapes_dtypes:
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        out.append(ws[off:off + n].view(dtype).reshape(shape))
        off += align(n)
    return out


@dataclass(frozen=True)
class Algo:
    """One way to compute an op's pass, with the scratch bytes it needs and a speed hint
    (relative time, for cost models that cannot measure it)."""

    name: str
    workspace: int
    speed: float = 1.0


class Op:
    """Base class of every op; subclasses set the class attributes they need."""

    name = "op"
    saved_inputs: tuple = ()    # inputs the backward reads
    saved_outputs: tuple = ()   # outputs the backward reads
    no_grad_inputs: tuple = ()  # inputs that never get a gradient (labels, BN running stats)
    accumulating_inputs: tuple = ()  # inputs whose gradient the backward can add into (ctx.accumulate)
    is_loss = False             # the backward seeds itself with d(loss) = 1
    recomputable = True         # the forward may run again during the backward
    flops_per_output = 1        # rough cost model hint, refined by ops that know better

    def infer(self, *specs: Spec) -> list:
        raise NotImplementedError

    def workspace(self, in_specs, out_specs) -> int:
        return 0

    def backward_workspace(self, in_specs, out_specs) -> int:
        return 0

    def algorithms(self, in_specs, out_specs, pass_) -> list:
        """The ways to run ``pass_`` ("forward" or "backward"); the first is the default (``algo=None``)."""
        ws = self.workspace(in_specs, out_specs) if pass_ == "forward" else self.backward_workspace(in_specs, out_specs)
        return [Algo(None, ws)]

    def native_algorithms(self, in_specs, out_specs, pass_) -> list:
        """The algorithms of kernels that read and write this op's own dtypes (a GPU library's, for
        planning on a GPU's profile); the CPU backend's are :meth:`algorithms` (a staged op's differ)."""
        return self.algorithms(in_specs, out_specs, pass_)

    def staged_algorithms(self, listing, in_specs, out_specs, pass_) -> list:
        """``listing(in_specs, out_specs, pass_)``: a backend's own list of this op's algorithms; a
        staged op (ops.staging) lists them at fp32 with its staging buffers added to each workspace."""
        return listing(in_specs, out_specs, pass_)

    def flops(self, in_specs, out_specs) -> float:
        return float(sum(int(np.prod(s.shape)) for s in out_specs)) * self.flops_per_output

    def forward(self, ctx, ins, outs, ws):
        raise NotImplementedError

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        raise NotImplementedError

    def recompute(self, ctx, ins, outs, ws, restore):
        """Run the forward again during the backward (``ctx.recompute`` is set) to restore the
        outputs flagged in ``restore``; the others are on the device as the forward left them."""
        self.forward(ctx, ins, outs, ws)

    def fused(self, consumer):
        """An op that runs this op's forward and then ``consumer``'s on this op's first output,
        in one pass that never writes that output (outputs: the consumer's, then this op's
        others), or None. The lowering recomputes such a pair as one step."""
        return None

    def __repr__(self):
        return self.name


def apply(op, *inputs):
    """Record ``op`` on traced ``inputs`` (values or Parameters); return its output(s)."""
    g = find_graph(*inputs)
    vals = [as_value(g, x) for x in inputs]
    outs = g.apply(op, vals)
    return outs[0] if len(outs) == 1 else outs


def same_float(*specs):
    dt = specs[0].dtype
    for s in specs[1:]:
        if s.dtype != dt:
            from ..errors import ShapeError
            raise ShapeError(f"dtype mismatch: {np.dtype(dt).name} vs {np.dtype(s.dtype).name}")
    return dt
