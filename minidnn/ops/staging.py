"""Low-precision ops on kernels that read and write fp32: each low-dtype argument staged in fp32.

Under mixed precision (minidnn.autocast) an op whose kernels take fp32 only runs as its
*staged* variant: a subclass of its own class (so it is still a ``Conv2dOp``, a
``BatchNorm2dOp`` ...) whose pass converts every bfloat16/float16 argument it reads into an
fp32 buffer (exact), runs the op's own fp32 kernel there (fp32 accumulation), and rounds each
fp32 result into the low-dtype buffer it writes (round to nearest even, once). The fp32 buffers
are the step's workspace: after the op's own workspace, at the end of the buffer, each
aligned, so the planner counts their bytes as it counts every workspace's. fp32 arguments
(master weights, BatchNorm's parameters and statistics) are handed through unstaged.
"""
from __future__ import annotations

import functools

import numpy as np

from ..graph import Spec
from ..precision import FP32, is_low
from ..schedule import aligned
from .base import Algo, nbytes_of


def _wide(specs):
    return [Spec(s.shape, FP32) if s is not None and is_low(s.dtype) else s for s in specs]


def _low(specs, picked=None):
    """(shape, fp32) of each low-dtype spec (of the positions in ``picked``), in order."""
    return [(s.shape, FP32) for i, s in enumerate(specs)
            if (picked is None or i in picked) and s is not None and is_low(s.dtype)]


class Staged:
    """The mixin of staged ops (placed before the op's class; see :func:`staged`)."""

    def infer(self, *specs):
        outs = super().infer(*specs)
        self._specs = (list(specs), list(outs))        # the staging layout of the node's passes
        return outs

    # -- the staging buffers, as the schedule sizes them ------------------------------------------
    def _forward_stage(self, ins, outs):
        return _low(ins) + _low(outs)

    def _backward_stage(self, ins, outs):
        grads = [i for i in range(len(ins)) if i not in self.no_grad_inputs]
        return (_low(ins, self.saved_inputs) + _low(outs, self.saved_outputs) + _low(outs)
                + _low(ins, grads))

    def _stage_bytes(self, ins, outs, pass_):
        stage = self._forward_stage(ins, outs) if pass_ == "forward" else self._backward_stage(ins, outs)
        return nbytes_of(stage)

    def workspace(self, ins, outs):
        return aligned(super().workspace(_wide(ins), _wide(outs))) + self._stage_bytes(ins, outs, "forward")

    def backward_workspace(self, ins, outs):
        return (aligned(super().backward_workspace(_wide(ins), _wide(outs)))
                + self._stage_bytes(ins, outs, "backward"))

    def staged_algorithms(self, listing, in_specs, out_specs, pass_) -> list:
        extra = self._stage_bytes(in_specs, out_specs, pass_)
        return [Algo(a.name, aligned(a.workspace) + extra, a.speed)
                for a in listing(_wide(in_specs), _wide(out_specs), pass_)]

    def algorithms(self, in_specs, out_specs, pass_) -> list:
        return self.staged_algorithms(super().algorithms, in_specs, out_specs, pass_)

    def native_algorithms(self, in_specs, out_specs, pass_) -> list:
        """The op's own algorithms at its low dtypes, as a kernel that reads them lists them: no staging."""
        return unstaged(self).algorithms(in_specs, out_specs, pass_)

    def fused(self, consumer):
        return None          # a fused recomputation's extra operand would need staging of its own

    # -- the passes -----------------------------------------------------------------------------
    def _carve(self, ws, pass_):
        """(the op's own workspace, the fp32 staging buffers) of ``ws``."""
        ins, outs = self._specs
        stage = self._forward_stage(ins, outs) if pass_ == "forward" else self._backward_stage(ins, outs)
        n = nbytes_of(stage)
        if not n:
            return ws, iter(())
        own, rest = ws[:ws.nbytes - n], ws[ws.nbytes - n:]
        bufs, off = [], 0
        for shape, dt in stage:
            size = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            bufs.append(rest[off:off + size].view(dt).reshape(shape))
            off += aligned(size)
        return (own if own.nbytes else None), iter(bufs)

    @staticmethod
    def _stage(arrays, bufs, picked=None, read=True):
        """``arrays`` with each low-dtype one (of ``picked`` positions) replaced by its fp32 buffer,
        filled from it when ``read``; also the (low array, buffer) pairs."""
        out, pairs = list(arrays), []
        for i, a in enumerate(arrays):
            if (picked is None or i in picked) and a is not None and is_low(a.dtype):
                b = next(bufs)
                if read:
                    np.copyto(b, a, casting="unsafe")
                out[i] = b
                pairs.append((a, b))
        return out, pairs

    @staticmethod
    def _round(pairs):
        with np.errstate(over="ignore"):       # fp16 overflows to inf: the loss scaler's to see
            for a, b in pairs:
                np.copyto(a, b, casting="unsafe")

    def forward(self, ctx, ins, outs, ws):
        own, bufs = self._carve(ws, "forward")
        wins, _ = self._stage(ins, bufs)
        wouts, pairs = self._stage(outs, bufs, read=False)
        super().forward(ctx, wins, wouts, own)
        self._round(pairs)

    def recompute(self, ctx, ins, outs, ws, restore):
        own, bufs = self._carve(ws, "forward")
        wins, _ = self._stage(ins, bufs)
        wouts, pairs = self._stage(outs, bufs)       # the outputs still on the device are read
        super().recompute(ctx, wins, wouts, own, restore)
        restored = [r for r, a in zip(restore, outs) if a is not None and is_low(a.dtype)]
        self._round([p for p, r in zip(pairs, restored) if r])

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        ins_specs, out_specs = self._specs
        own, bufs = self._carve(ws, "backward")
        wins, _ = self._stage(ins, self._slots(bufs, ins_specs, self.saved_inputs, ins))
        wouts, _ = self._stage(outs, self._slots(bufs, out_specs, self.saved_outputs, outs))
        wgouts, _ = self._stage(gouts, self._slots(bufs, out_specs, None, gouts))
        grads = [i for i in range(len(ins_specs)) if i not in self.no_grad_inputs]
        wgins, pairs = self._stage(gins, self._slots(bufs, ins_specs, grads, gins), read=False)
        for i in ctx.accumulate:           # added into: its current value is read first
            if wgins[i] is not gins[i]:
                np.copyto(wgins[i], gins[i], casting="unsafe")
        super().backward(ctx, wins, wouts, wgouts, wgins, own)
        self._round(pairs)

    @staticmethod
    def _slots(bufs, specs, picked, arrays):
        """The buffers of the staged positions of ``specs`` (as the layout reserved them), for the
        arrays present; a buffer reserved for an absent (None) array is skipped."""
        out = []
        for i, s in enumerate(specs):
            if (picked is None or i in picked) and is_low(s.dtype):
                b = next(bufs)
                if arrays[i] is not None:
                    out.append(b)
        return iter(out)


@functools.cache
def _staged_class(cls):
    return type(f"Staged{cls.__name__}", (Staged, cls), {})


def _as(cls, op):
    new = object.__new__(cls)
    new.__dict__.update(op.__dict__)
    return new


def staged(op):
    """``op`` as its staged variant (a new op of a subclass of its class, with its attributes)."""
    return op if isinstance(op, Staged) else _as(_staged_class(type(op)), op)


def unstaged(op):
    """A staged ``op`` as an op of its own class again (with its attributes)."""
    return _as(type(op).__bases__[1], op) if isinstance(op, Staged) else op
