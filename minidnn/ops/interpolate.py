"""Resizing (N, C, H, W) by 'nearest' or 'bilinear' interpolation, as ``torch.nn.functional.interpolate``.

Both modes are separable: y = Ah x Aw^T per (sample, channel), where Ah (OH x H)
and Aw (OW x W) hold each output row's (column's) weights on the input rows
(columns) - one 1 per row for 'nearest', two weights summing to 1 for
'bilinear'. So the forward and the backward (gx = Ah^T gy Aw) are two batched
matrix products each, through the backend's BLAS, deterministic (no scatter
with atomics), and the backward reads no tensor of the forward. The matrices
and the product between the two passes live in the op's workspace.

Source positions follow PyTorch exactly, which matters for 'nearest' (an index
off by one is a different image): the scale is 1/scale_factor where a
scale_factor is given (and ``recompute_scale_factor`` is not set), otherwise
in/out, computed in float32 for 'nearest'; 'bilinear' uses (dst + 0.5) * scale
- 0.5 clamped at 0, or dst * (in - 1)/(out - 1) with ``align_corners``.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..errors import ShapeError
from ..graph import Spec
from .base import Op, apply, carve, nbytes_of

MODES = ("nearest", "bilinear")


def _pair_of(v, what, kind):
    pair = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    if len(pair) != 2 or not all(isinstance(p, kind) and not isinstance(p, bool) and p > 0 for p in pair):
        raise ShapeError(f"{what} must be a positive number or a pair of them for a 4-D input, got {v!r}")
    return pair


def check_arguments(size, scale_factor, mode, align_corners):
    """PyTorch's rules for interpolate's arguments (ShapeError, a ValueError, where they are broken)."""
    if mode not in MODES:
        raise ShapeError(f"mode {mode!r} is not supported (supported: {', '.join(map(repr, MODES))})")
    if align_corners is not None and mode == "nearest":
        raise ShapeError("align_corners option can only be set with the interpolating modes: bilinear")
    if (size is None) == (scale_factor is None):
        raise ShapeError("exactly one of size and scale_factor must be given")
    if size is not None:
        _pair_of(size, "size", numbers.Integral)
    else:
        _pair_of(scale_factor, "scale_factor", numbers.Real)


class InterpolateOp(Op):
    """The arguments are checked when recorded, so that a wrong one names the module path."""

    name = "interpolate"

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None):
        self.args = (size, scale_factor, mode, align_corners)
        self.size = self.scale_factor = None
        self.mode, self.align_corners = mode, bool(align_corners)
        self.recompute_scale_factor = bool(recompute_scale_factor)
        self.name = f"upsample_{mode}"

    def _parse(self):
        size, scale_factor, mode, align_corners = self.args
        check_arguments(size, scale_factor, mode, align_corners)
        if size is not None:
            self.size = tuple(int(s) for s in _pair_of(size, "size", numbers.Integral))
        else:
            self.scale_factor = tuple(float(s) for s in _pair_of(scale_factor, "scale_factor", numbers.Real))

    def out_size(self, h, w):
        if self.size is not None:
            return self.size
        return tuple(math.floor(float(n) * s) for n, s in zip((h, w), self.scale_factor))

    def _scales(self):
        """The scale factors the source positions use (None: in/out)."""
        if self.scale_factor is None or self.recompute_scale_factor:
            return (None, None)
        return self.scale_factor

    def infer(self, x):
        self._parse()
        if len(x.shape) != 4:
            raise ShapeError(f"expected a 4-D input (N, C, H, W) for mode {self.mode!r}, got {len(x.shape)}-D")
        n, c, h, w = x.shape
        oh, ow = self.out_size(h, w)
        if oh < 1 or ow < 1:
            raise ShapeError(f"the output size ({oh}, {ow}) of a {h}x{w} input must be positive")
        return [Spec((n, c, oh, ow), x.dtype)]

    def flops(self, ins, outs):
        (n, c, h, w), (oh, ow) = ins[0].shape, outs[0].shape[2:]
        return 2.0 * n * c * (h * w * ow + oh * h * ow)

    def _scratch(self, x, backward):
        """Ah, Aw and the product between the two passes: x Aw^T (N, C, H, OW) in the forward,
        gy Aw (N, C, OH, W) in the backward."""
        n, c, h, w = x.shape
        oh, ow = self.out_size(h, w)
        mid = (n, c, oh, w) if backward else (n, c, h, ow)
        return [((oh, h), x.dtype), ((ow, w), x.dtype), (mid, x.dtype)]

    def workspace(self, ins, outs):
        return nbytes_of(self._scratch(ins[0], backward=False))

    def backward_workspace(self, ins, outs):
        return nbytes_of(self._scratch(ins[0], backward=True))

    def _matrices(self, xp, ah, aw):
        for a, scale in zip((ah, aw), self._scales()):
            (_nearest if self.mode == "nearest" else _bilinear)(xp, a, scale, self.align_corners)

    def forward(self, ctx, ins, outs, ws):
        xp = ctx.xp
        x, y = ins[0], outs[0]
        ah, aw, t = carve(ws, self._scratch(x, backward=False))
        self._matrices(xp, ah, aw)
        xp.matmul(x.reshape(-1, x.shape[3]), aw.T, out=t.reshape(-1, t.shape[3]))    # rows: one GEMM
        xp.matmul(ah, t, out=y)                                                       # per (n, c)

    def backward(self, ctx, ins, outs, gouts, gins, ws):
        xp = ctx.xp
        gy, gx = gouts[0], gins[0]
        ah, aw, t = carve(ws, self._scratch(gx, backward=True))
        self._matrices(xp, ah, aw)
        xp.matmul(gy.reshape(-1, gy.shape[3]), aw, out=t.reshape(-1, t.shape[3]))
        xp.matmul(ah.T, t, out=gx)


def _nearest(xp, a, scale, align_corners):
    """``a`` (out x in): PyTorch's nearest source of each output, floor(dst * scale) in float32."""
    out, n = a.shape
    a[...] = 0
    if out == n:
        src = xp.arange(out)
    elif out == 2 * n:
        src = xp.arange(out) // 2
    else:
        s = np.float32(1.0 / scale) if scale is not None else np.float32(n) / np.float32(out)
        src = xp.minimum(xp.floor(xp.arange(out, dtype=np.float32) * s).astype(np.int64), n - 1)
    a[xp.arange(out), src] = 1


def _bilinear(xp, a, scale, align_corners):
    """``a`` (out x in): the two linear weights of each output on its neighbouring inputs."""
    out, n = a.shape
    a[...] = 0
    dst = xp.arange(out, dtype=np.float64)
    if out == n:
        a[dst.astype(np.int64), dst.astype(np.int64)] = 1
        return
    if align_corners:
        src = dst * ((n - 1) / (out - 1) if out > 1 else 0.0)
    else:
        s = 1.0 / scale if scale is not None else n / out
        src = xp.maximum((dst + 0.5) * s - 0.5, 0.0)
    i0 = xp.minimum(xp.floor(src).astype(np.int64), n - 1)
    i1 = xp.minimum(i0 + 1, n - 1)
    l1 = xp.clip(src - i0, 0.0, 1.0)
    rows = xp.arange(out)
    a[rows, i0] += 1.0 - l1
    a[rows, i1] += l1


def interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """As ``torch.nn.functional.interpolate`` on (N, C, H, W), for modes 'nearest' and 'bilinear'."""
    if antialias:
        raise ShapeError("interpolate: antialias=True is not supported")
    return apply(InterpolateOp(size, scale_factor, mode, align_corners, recompute_scale_factor), x)
