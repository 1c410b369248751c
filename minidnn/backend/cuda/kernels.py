"""The CUDA backend's kernel set: the names and signatures of ``minidnn._C`` that ops call, on CuPy arrays.

Like _C's, every kernel writes into the arrays it is handed and allocates no
array the size of an activation (per-channel partial sums of a few doubles are
the only temporaries). Reductions are deterministic: fixed shares of each
channel per block, a fixed stride per thread and a fixed tree, in float64, then
each channel's shares added in order (``kernel_sources.REDUCE``); BatchNorm's
statistics take one pass over the data. Max-pool and average-pool
gradients (adaptive ones too) gather (each input pixel sums the windows that read it) instead of
scattering with atomics, so they are deterministic too.

Activations may be float32, float64, or mixed precision's float16 and bfloat16
(``kernel_sources.DTYPES``); BatchNorm's parameters and statistics are then
float32 (``kernel_sources.STATS``). A 2-byte kernel reads the low values,
computes as the float kernel does and rounds each result once: its result is the
float kernel's on the same values, rounded.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from .gemm import gemm_accumulate
from .kernel_sources import ADAPTIVE, DTYPES, ELEMENTWISE, POOL, REDUCE, STATS, prelude

_THREADS = 256
_BLOCKS = 2048          # blocks a reduction aims for (a fixed number: the same shares, so the same bits, on any GPU)
_NARROW = 2**31         # arrays smaller than this index in 32 bits


def _index(size):
    """(C index type, its NumPy scalar type) for an array of ``size`` elements."""
    return ("unsigned int", np.uint32) if size < _NARROW else ("long long", np.int64)


def _module(source, dtype, index="long long"):
    return cp.RawModule(code=prelude(np.dtype(dtype).name, index) + source, options=("--std=c++14",))


def _check(data, stats=()):
    """``data``: activations and their gradients, one dtype of DTYPES; ``stats``: BatchNorm's parameters and
    statistics, in that dtype's STATS (float32 for the 2-byte types). None entries are absent arguments."""
    dt = data[0].dtype
    if dt.name not in DTYPES:
        raise TypeError(f"expected float32, float64, float16 or bfloat16 arrays, got {dt}")
    for group, want in ((data, dt.name), (stats, STATS[dt.name])):
        for a in group:
            if a is None:
                continue
            if not isinstance(a, cp.ndarray):
                raise TypeError(f"expected a cupy.ndarray, got {type(a).__name__}")
            if a.dtype.name != want:
                raise TypeError(f"expected {want} arrays beside {dt.name} activations, got {a.dtype}")
            if not a.flags.c_contiguous:
                raise ValueError("expected C-contiguous arrays")


class CudaKernels:
    """Kernels with ``minidnn._C``'s names; one instance per backend (compiled modules are cached by CuPy)."""

    def __init__(self):
        self._modules = {}

    def _fn(self, source, dtype, name, index="long long"):
        key = (id(source), np.dtype(dtype), index)
        if key not in self._modules:
            self._modules[key] = _module(source, dtype, index)
        return self._modules[key].get_function(name)

    def _each(self, name, n, arrays, dtype, rest=()):
        """Launch ELEMENTWISE's ``name`` over ``n`` elements: its arguments are ``arrays``, ``n``, then ``rest``."""
        if n:
            index, it = _index(n)
            self._fn(ELEMENTWISE, dtype, name, index)((-(-n // _THREADS),), (_THREADS,), (*arrays, it(n), *rest))

    # -- elementwise -------------------------------------------------------
    def relu_forward(self, x, y):
        _check([x, y])          # the select bn_forward_train(relu=True) makes: the same bits
        self._each("relu_fwd", x.size, (x, y), x.dtype)

    def add(self, a, b, out):
        if b is None:
            cp.copyto(out, a)
        else:
            cp.add(a, b, out=out)

    def relu_backward(self, y, gy, gx):
        _check([y, gy, gx])
        self._each("relu_bwd", y.size, (y, gy, gx), y.dtype)

    def add_inplace(self, dst, src):
        cp.add(dst, src.reshape(dst.shape), out=dst)

    # -- per-channel reductions ------------------------------------------
    def _reduce(self, a, mode, b=None, m=None, inv=None):
        """Per-channel float64 (s0, s1) of ``a`` (see kernel_sources.REDUCE for the modes)."""
        _check([a, b], [m, inv])
        n, c = a.shape[0], a.shape[1]
        length = a.size // (n * c) if a.size else 0
        s0 = cp.empty(c, np.float64)
        s1 = cp.empty(c, np.float64) if mode else s0
        total = n * length
        if not c or not total:
            s0.fill(0)
            s1.fill(0)
            return s0, s1
        shares = max(1, min(-(-_BLOCKS // c), -(-total // (4 * _THREADS))))   # >= 4 values a thread
        share = -(-total // shares)
        shares = -(-total // share)
        index, it = _index(a.size)
        part = cp.empty(c * shares * 2, np.float64)
        self._fn(REDUCE, a.dtype, "channel_partial", index)(
            (c, shares), (_THREADS,), (a, b if b is not None else a, m if m is not None else a,
                                       inv if inv is not None else a, part, it(n), it(c), it(length), it(share),
                                       np.int32(mode)))
        self._fn(REDUCE, a.dtype, "channel_total", index)(
            (-(-c // _THREADS),), (_THREADS,), (a, part, s0, s1, it(c), it(length), it(shares),
                                                np.float64(total), np.int32(mode)))
        return s0, s1

    def bn_stats(self, x, mean, var):
        """The batch mean and biased variance per channel, in one pass over x (in float64, stored in mean's dtype)."""
        _check([x], [mean, var])
        s0, s1 = self._reduce(x, 1)
        mean[...] = s0
        var[...] = s1

    def bn_forward_train(self, x, gamma, beta, mean, invstd, y, relu=False, residual=None):
        _check([x, y, residual], [gamma, beta, mean, invstd])
        self._each("bn_apply", x.size, (x, gamma if gamma is not None else mean, beta if beta is not None else mean,
                                        mean, invstd, residual if residual is not None else x, y), x.dtype,
                   (*self._lc(x), np.int32(gamma is not None), np.int32(beta is not None),
                    np.int32(residual is not None), np.int32(relu)))

    def bn_backward(self, x, gy, gamma, mean, invstd, gx, ggamma=None, gbeta=None):
        _check([x, gy, gx], [gamma, mean, invstd, ggamma, gbeta])
        n, c = x.shape[0], x.shape[1]
        length = x.size // (n * c)
        sgy, sgyx = self._reduce(gy, 2, b=x, m=mean, inv=invstd)
        self._each("bn_grad", x.size, (x, gy, gamma if gamma is not None else mean, mean, invstd, sgy, sgyx, gx),
                   x.dtype, (*self._lc(x), np.float64(n * length), np.int32(gamma is not None)))
        if ggamma is not None:
            ggamma[...] = sgyx
        if gbeta is not None:
            gbeta[...] = sgy

    @staticmethod
    def _lc(x):
        """(L, C) of an NCHW array, in the index type its elementwise kernels are compiled with."""
        _, it = _index(x.size)
        return it(x.size // (x.shape[0] * x.shape[1])), it(x.shape[1])

    def conv2d_bias_grad(self, gy, gb):
        s0, _ = self._reduce(gy, 0)
        gb[...] = s0

    def conv2d_add_bias(self, y, b):
        y += b.reshape((1, -1) + (1,) * (y.ndim - 2))

    # -- pooling -----------------------------------------------------------
    @staticmethod
    def _win(kh, kw, sh, sw, ph, pw, dh=1, dw=1):
        return tuple(np.int32(v) for v in (kh, kw, sh, sw, ph, pw, dh, dw))

    def _launch(self, name, total, args, dtype, source=POOL):
        if total:
            self._fn(source, dtype, name)(((total + _THREADS - 1) // _THREADS,), (_THREADS,), args)

    def maxpool2d_forward(self, x, y, kh, kw, sh, sw, ph, pw, dh, dw):
        _check([x, y])
        n, c, h, w = x.shape
        oh, ow = y.shape[2:]
        self._launch("maxpool_fwd", y.size, (x, y, np.int64(n * c), np.int32(h), np.int32(w), np.int32(oh),
                                             np.int32(ow), *self._win(kh, kw, sh, sw, ph, pw, dh, dw)), x.dtype)

    def maxpool2d_backward(self, x, gy, gx, kh, kw, sh, sw, ph, pw, dh, dw):
        _check([x, gy, gx])
        n, c, h, w = x.shape
        oh, ow = gy.shape[2:]
        self._launch("maxpool_bwd", gx.size, (x, gy, gx, np.int64(n * c), np.int32(h), np.int32(w), np.int32(oh),
                                              np.int32(ow), *self._win(kh, kw, sh, sw, ph, pw, dh, dw)), x.dtype)

    def avgpool2d_forward(self, x, y, kh, kw, sh, sw, ph, pw, count_include_pad):
        _check([x, y])
        n, c, h, w = x.shape
        oh, ow = y.shape[2:]
        self._launch("avgpool_fwd", y.size, (x, y, np.int64(n * c), np.int32(h), np.int32(w), np.int32(oh),
                                             np.int32(ow), *self._win(kh, kw, sh, sw, ph, pw),
                                             np.bool_(count_include_pad)), x.dtype)

    def avgpool2d_backward(self, gy, gx, kh, kw, sh, sw, ph, pw, count_include_pad):
        _check([gy, gx])
        n, c, h, w = gx.shape
        oh, ow = gy.shape[2:]
        self._launch("avgpool_bwd", gx.size, (gy, gx, np.int64(n * c), np.int32(h), np.int32(w), np.int32(oh),
                                              np.int32(ow), *self._win(kh, kw, sh, sw, ph, pw),
                                              np.bool_(count_include_pad)), gx.dtype)

    def _adaptive(self, name, x_like, y_like, arrays, total):
        _check(list(arrays))
        n, c, h, w = x_like.shape
        oh, ow = y_like.shape[2:]
        self._launch(name, total, (*arrays, np.int64(n * c), np.int32(h), np.int32(w), np.int32(oh),
                                   np.int32(ow)), arrays[0].dtype, ADAPTIVE)

    def adaptive_avgpool2d_forward(self, x, y):
        self._adaptive("adaptive_avg_fwd", x, y, (x, y), y.size)

    def adaptive_avgpool2d_backward(self, gy, gx):
        self._adaptive("adaptive_avg_bwd", gx, gy, (gy, gx), gx.size)

    def adaptive_maxpool2d_forward(self, x, y):
        self._adaptive("adaptive_max_fwd", x, y, (x, y), y.size)

    def adaptive_maxpool2d_backward(self, x, gy, gx):
        self._adaptive("adaptive_max_bwd", x, gy, (x, gy, gx), gx.size)

    # -- GEMM with accumulation (Linear's gradient across sub-batches) -----
    def gemm_acc(self, x, gy, gw):
        """gw += gy.T @ x through cuBLAS with beta = 1 (no temporary the size of the weight), accumulating
        in float32 for 16-bit arrays (CUBLAS_COMPUTE_32F)."""
        gemm_accumulate(x, gy, gw)
