"""The CUDA backend's kernel set: the names and signatures of ``minidnn._C`` that ops call, on CuPy arrays.

Like _C's, every kernel writes into the arrays it is handed and allocates no
array the size of an activation (per-channel partial sums of a few doubles are
the only temporaries). Reductions are deterministic: fixed shares of each
channel per block, a fixed stride per thread and a fixed tree, in float64, then
each channel's shares added in order (``kernel_sources.REDUCE``); BatchNorm's
statistics take one pass over the data. Max-pool and average-pool
gradients (adaptive ones too) gather (each input pixel sums the windows that read it) instead of
scattering with atomics, so they are deterministic too.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from .kernel_sources import ADAPTIVE, POOL, REDUCE

_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_THREADS = 256
_BLOCKS = 2048          # blocks a reduction aims for (a fixed number: the same shares, so the same bits, on any GPU)
_NARROW = 2**31         # arrays smaller than this index in 32 bits

_relu_forward = cp.ElementwiseKernel("T x", "T y", "y = x < (T)0 ? (T)0 : x", "minidnn_relu_forward")
_relu_backward = cp.ElementwiseKernel("T y, T gy", "T gx", "gx = y > (T)0 ? gy : (T)0", "minidnn_relu_backward")
_bn_apply = cp.ElementwiseKernel(
    "T x, raw T gamma, raw T beta, raw T mean, raw T invstd, raw T res, int64 L, int64 C, bool has_g, bool has_b, "
    "bool has_res, bool relu, bool narrow", "T y",
    """
    const long long c = narrow ? (long long)(((unsigned int)i / (unsigned int)L) % (unsigned int)C) : (i / L) % C;
    const double a = (double)invstd[c] * (has_g ? (double)gamma[c] : 1.0);
    const double s = (has_b ? (double)beta[c] : 0.0) - (double)mean[c] * a;
    T v = (T)((double)x * a + s);
    if (has_res) v = v + res[i];
    y = relu && v < (T)0 ? (T)0 : v;
    """, "minidnn_bn_apply")
_bn_grad = cp.ElementwiseKernel(
    "T x, T gy, raw T gamma, raw T mean, raw T invstd, raw float64 sgy, raw float64 sgyx, int64 L, int64 C, "
    "float64 M, bool has_g, bool narrow", "T gx",
    """
    const long long c = narrow ? (long long)(((unsigned int)i / (unsigned int)L) % (unsigned int)C) : (i / L) % C;
    const double inv = (double)invstd[c];
    const double xhat = ((double)x - (double)mean[c]) * inv;
    const double k = (has_g ? (double)gamma[c] : 1.0) * inv / M;
    gx = (T)(k * (M * (double)gy - sgy[c] - xhat * sgyx[c]));
    """, "minidnn_bn_grad")


def _module(source, dtype, index="long long"):
    return cp.RawModule(code=f"typedef {_CTYPE[np.dtype(dtype)]} T;\ntypedef {index} I;\n" + source,
                        options=("--std=c++14",))


class CudaKernels:
    """Kernels with ``minidnn._C``'s names; one instance per backend (compiled modules are cached by CuPy)."""

    def __init__(self):
        self._modules = {}

    def _fn(self, source, dtype, name, index="long long"):
        key = (id(source), np.dtype(dtype), index)
        if key not in self._modules:
            self._modules[key] = _module(source, dtype, index)
        return self._modules[key].get_function(name)

    @staticmethod
    def _check(*arrays):
        dt = arrays[0].dtype
        for a in arrays:
            if a is None:
                continue
            if not isinstance(a, cp.ndarray):
                raise TypeError(f"expected a cupy.ndarray, got {type(a).__name__}")
            if a.dtype != dt or dt not in _CTYPE:
                raise TypeError(f"expected float32 or float64 arrays of one dtype, got {a.dtype} and {dt}")
            if not a.flags.c_contiguous:
                raise ValueError("expected C-contiguous arrays")

    # -- elementwise -------------------------------------------------------
    def relu_forward(self, x, y):
        _relu_forward(x, y)     # the select bn_forward_train(relu=True) makes: the same bits

    def add(self, a, b, out):
        if b is None:
            cp.copyto(out, a)
        else:
            cp.add(a, b, out=out)

    def relu_backward(self, y, gy, gx):
        _relu_backward(y, gy, gx)

    def add_inplace(self, dst, src):
        cp.add(dst, src.reshape(dst.shape), out=dst)

    # -- per-channel reductions ------------------------------------------
    def _reduce(self, a, mode, b=None, m=None, inv=None):
        """Per-channel float64 (s0, s1) of ``a`` (see kernel_sources.REDUCE for the modes)."""
        self._check(a, b, m, inv)
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
        index, it = ("unsigned int", np.uint32) if a.size < _NARROW else ("long long", np.int64)
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
        """The batch mean and biased variance per channel, in one pass over x."""
        s0, s1 = self._reduce(x, 1)
        mean[...] = s0
        var[...] = s1

    def bn_forward_train(self, x, gamma, beta, mean, invstd, y, relu=False, residual=None):
        self._check(x, gamma, beta, mean, invstd, y, residual)
        c = x.shape[1]
        _bn_apply(x, gamma if gamma is not None else mean, beta if beta is not None else mean, mean, invstd,
                  residual if residual is not None else x, np.int64(x.size // (x.shape[0] * c)), np.int64(c),
                  gamma is not None, beta is not None, residual is not None, relu, x.size < _NARROW, y)

    def bn_backward(self, x, gy, gamma, mean, invstd, gx, ggamma=None, gbeta=None):
        self._check(x, gy, gamma, mean, invstd, gx, ggamma, gbeta)
        n, c = x.shape[0], x.shape[1]
        length = x.size // (n * c)
        sgy, sgyx = self._reduce(gy, 2, b=x, m=mean, inv=invstd)
        _bn_grad(x, gy, gamma if gamma is not None else mean, mean, invstd, sgy, sgyx, np.int64(length), np.int64(c),
                 float(n * length), gamma is not None, x.size < _NARROW, gx)
        if ggamma is not None:
            ggamma[...] = sgyx
        if gbeta is not None:
            gbeta[...] = sgy

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
        self._check(x, y)
        n, c, h, w = x.shape
        oh, ow = y.shape[2:]
        self._launch("maxpool_fwd", y.size, (x, y, np.int64(n * c), np.int32(h), np.int32(w), np.int32(oh),
                                             np.int32(ow), *self._win(kh, kw, sh, sw, ph, pw, dh, dw)), x.dtype)

    def maxpool2d_backward(self, x, gy, gx, kh, kw, sh, sw, ph, pw, dh, dw):
        self._check(x, gy, gx)
        n, c, h, w = x.shape
        oh, ow = gy.shape[2:]
        self._launch("maxpool_bwd", gx.size, (x, gy, gx, np.int64(n * c), np.int32(h), np.int32(w), np.int32(oh),
                                              np.int32(ow), *self._win(kh, kw, sh, sw, ph, pw, dh, dw)), x.dtype)

    def avgpool2d_forward(self, x, y, kh, kw, sh, sw, ph, pw, count_include_pad):
        self._check(x, y)
        n, c, h, w = x.shape
        oh, ow = y.shape[2:]
        self._launch("avgpool_fwd", y.size, (x, y, np.int64(n * c), np.int32(h), np.int32(w), np.int32(oh),
                                             np.int32(ow), *self._win(kh, kw, sh, sw, ph, pw),
                                             np.bool_(count_include_pad)), x.dtype)

    def avgpool2d_backward(self, gy, gx, kh, kw, sh, sw, ph, pw, count_include_pad):
        self._check(gy, gx)
        n, c, h, w = gx.shape
        oh, ow = gy.shape[2:]
        self._launch("avgpool_bwd", gx.size, (gy, gx, np.int64(n * c), np.int32(h), np.int32(w), np.int32(oh),
                                              np.int32(ow), *self._win(kh, kw, sh, sw, ph, pw),
                                              np.bool_(count_include_pad)), gx.dtype)

    def _adaptive(self, name, x_like, y_like, arrays, total):
        self._check(*arrays)
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
        """gw += gy.T @ x through cuBLAS with beta = 1 (no temporary the size of the weight)."""
        from cupy import cublas
        cublas.gemm("T", "N", gy, x, out=gw, alpha=1.0, beta=1.0)
