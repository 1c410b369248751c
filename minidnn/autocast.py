"""Where the graph casts under mixed precision: torch.autocast's op lists, applied while tracing.

A :class:`Graph` traced with a bf16/fp16 :class:`~minidnn.precision.Precision` hands every op
it records to :meth:`Autocast.prepare` first, which inserts :class:`~minidnn.ops.cast.CastOp`
nodes in front of it (each value cast to a dtype once per graph: a weight feeding two layers
has one low-precision copy) and picks the op's staged variant where it reads or writes a low
dtype (:mod:`minidnn.ops.staging`). The casts are ordinary nodes: their outputs are planned
tensors that can be kept, recomputed or offloaded, their backward converts the gradient back.

- convolutions and linear layers run in the low dtype (autocast's lower-precision list):
  every floating-point input, weights included, is cast down;
- losses, LayerNorm and GroupNorm run in fp32 (the fp32 list of PyTorch's CPU or CUDA
  autocast): every low input is cast up, so their outputs are fp32;
- every other op runs in the widest floating-point type among its activation inputs (PyTorch's
  type promotion: ``bf16 + fp32`` is fp32), with parameters and statistics as they are (fp32):
  BatchNorm reads a low ``x`` with fp32 affine parameters and running statistics, computes its
  statistics in fp32 and writes a low ``y``.
"""
from __future__ import annotations

import numpy as np

from .precision import FP32, is_float, is_low

LOW_OPS = frozenset({"conv2d", "conv_transpose2d", "linear"})
FP32_OPS = frozenset({"cross_entropy", "mse", "mean_of_losses", "layer_norm", "group_norm", "softmax",
                      "log_softmax"})
# ops whose kernels read and write any float dtype themselves (copies and the cast itself)
NATIVE_OPS = frozenset({"reshape", "slice"})


class Autocast:
    """The mixed-precision policy of one precision (its ``low`` dtype) on one backend, whose kernels
    read and write the low dtypes themselves for the ops named in ``native`` (the CUDA backend's
    NATIVE_OPS; none on the CPU backend: its kernels are fp32, so every other op is staged); holds
    no state of a graph."""

    def __init__(self, precision, native=frozenset()):
        self.precision = precision
        self.low = precision.low
        self.native = NATIVE_OPS | frozenset(native)

    def label_dtype(self, dtype):
        """A loss's target is fed as the trainer's fp32 (a low dtype is widened)."""
        return FP32 if is_low(dtype) else np.dtype(dtype)

    def prepare(self, graph, op, inputs):
        """(the op to record, its inputs) with the casts recorded in ``graph`` first."""
        from .ops.cast import CastOp
        from .ops.staging import Staged, staged
        if isinstance(op, CastOp):
            return op, inputs
        floats = [i for i, v in enumerate(inputs) if is_float(v.dtype)]
        if op.name in LOW_OPS:
            target = {i: self.low for i in floats}
        elif op.name in FP32_OPS:
            target = {i: FP32 for i in floats if is_low(inputs[i].dtype)}
        else:
            acts = [i for i in floats if inputs[i].kind not in ("param", "state")
                    and (is_low(inputs[i].dtype) or inputs[i].dtype == FP32)]
            mixed = {np.dtype(inputs[i].dtype) for i in acts}
            target = {i: FP32 for i in acts if is_low(inputs[i].dtype)} if FP32 in mixed and len(mixed) > 1 else {}
        inputs = [self._cast(graph, v, target[i]) if i in target and np.dtype(v.dtype) != target[i] else v
                  for i, v in enumerate(inputs)]
        if (op.name not in self.native and not isinstance(op, Staged)
                and any(is_low(v.dtype) for v in inputs)):
            op = staged(op)
        return op, inputs

    @staticmethod
    def _cast(graph, value, dtype):
        from .ops.cast import CastOp
        key = (value.id, np.dtype(dtype))
        cast = graph.casts.get(key)
        if cast is None:
            (cast,) = graph.apply(CastOp(dtype), [value])
            graph.casts[key] = cast
        return cast
