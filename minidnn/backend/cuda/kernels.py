"""The CUDA backend's kernel set: the names and signatures of ``minidnn._C`` that ops call, on CuPy arrays.

Like _C's, every kernel writes into the arrays it is handed and allocates no
array the size of an activation (per-channel sums of a few doubles are the only
temporaries). Reductions are deterministic: one block per channel, a fixed
stride per thread and a fixed tree, in float64. Max-pool and average-pool
gradients (adaptive ones too) gather (each input pixel sums the windows that read it) instead of
scattering with atomics, so they are deterministic too.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_THREADS = 256

_REDUCE = r"""
// Per channel c of a (N, C, L): mode 0: s0 = sum(a); mode 1: s0 = sum((a - m[c])^2);
// mode 2: s0 = sum(a), s1 = sum(a * (b - m[c]) * inv[c]).
extern "C" __global__ void channel_reduce(const T* a, const T* b, const T* m, const T* inv, double* s0, double* s1,
                                          long long N, long long C, long long L, int mode) {
    __shared__ double r0[256], r1[256];
    const long long c = blockIdx.x;
    double acc0 = 0.0, acc1 = 0.0;
    const double mc = mode ? (double)m[c] : 0.0;
    const double ic = mode == 2 ? (double)inv[c] : 0.0;
    for (long long k = threadIdx.x; k < N * L; k += blockDim.x) {
        const long long idx = (k / L) * C * L + c * L + k % L;
        const double v = (double)a[idx];
        if (mode == 1) { const double d = v - mc; acc0 += d * d; }
        else acc0 += v;
        if (mode == 2) acc1 += v * ((double)b[idx] - mc) * ic;
    }
    r0[threadIdx.x] = acc0; r1[threadIdx.x] = acc1;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) { r0[threadIdx.x] += r0[threadIdx.x + s]; r1[threadIdx.x] += r1[threadIdx.x + s]; }
        __syncthreads();
    }
    if (threadIdx.x == 0) { s0[c] = r0[0]; if (mode == 2) s1[c] = r1[0]; }
}
"""

_POOL = r"""
struct Win { int kh, kw, sh, sw, ph, pw, dh, dw; };

// The first maximum of window (oh, ow) in row-major order (a later element wins only if strictly
// greater, or NaN); -1 if every tap is padding.
__device__ int window_argmax(const T* x, int H, int W, int oh, int ow, Win g) {
    int best = -1; T bv = 0;
    for (int i = 0; i < g.kh; ++i) {
        const int ih = oh * g.sh - g.ph + i * g.dh;
        if (ih < 0 || ih >= H) continue;
        for (int j = 0; j < g.kw; ++j) {
            const int iw = ow * g.sw - g.pw + j * g.dw;
            if (iw < 0 || iw >= W) continue;
            const T v = x[ih * W + iw];
            if (best < 0 || v > bv || isnan(v)) { best = ih * W + iw; bv = v; }
        }
    }
    return best;
}

extern "C" __global__ void maxpool_fwd(const T* x, T* y, long long planes, int H, int W, int OH, int OW,
                                       int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw) {
    const Win g = {kh, kw, sh, sw, ph, pw, dh, dw};
    const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (t >= planes * OH * OW) return;
    const long long p = t / (OH * OW);
    const int oh = (t / OW) % OH, ow = t % OW;
    const int a = window_argmax(x + p * H * W, H, W, oh, ow, g);
    y[t] = a < 0 ? (T)(-__longlong_as_double(0x7ff0000000000000LL)) : x[p * H * W + a];
}

// Gather: each input pixel adds gy of every window that read it and chose it.
extern "C" __global__ void maxpool_bwd(const T* x, const T* gy, T* gx, long long planes, int H, int W, int OH,
                                       int OW, int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw) {
    const Win g = {kh, kw, sh, sw, ph, pw, dh, dw};
    const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (t >= planes * H * W) return;
    const long long p = t / (H * W);
    const int ih = (t / W) % H, iw = t % W;
    double acc = 0.0;
    for (int i = 0; i < g.kh; ++i) {
        const int nh = ih + g.ph - i * g.dh;
        if (nh < 0 || nh % g.sh) continue;
        const int oh = nh / g.sh;
        if (oh >= OH) continue;
        for (int j = 0; j < g.kw; ++j) {
            const int nw = iw + g.pw - j * g.dw;
            if (nw < 0 || nw % g.sw) continue;
            const int ow = nw / g.sw;
            if (ow >= OW) continue;
            if (window_argmax(x + p * H * W, H, W, oh, ow, g) == ih * W + iw) acc += (double)gy[(p * OH + oh) * OW + ow];
        }
    }
    gx[t] = (T)acc;
}

__device__ int avg_count(int H, int W, int oh, int ow, Win g, bool include_pad) {
    const int h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
    if (include_pad) return g.kh * g.kw;
    const int h1 = min(h0 + g.kh, H), w1 = min(w0 + g.kw, W);
    return (h1 - max(h0, 0)) * (w1 - max(w0, 0));
}

extern "C" __global__ void avgpool_fwd(const T* x, T* y, long long planes, int H, int W, int OH, int OW,
                                       int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw,
                                       bool include_pad) {
    const Win g = {kh, kw, sh, sw, ph, pw, dh, dw};
    const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (t >= planes * OH * OW) return;
    const long long p = t / (OH * OW);
    const int oh = (t / OW) % OH, ow = t % OW;
    double s = 0.0;
    for (int i = 0; i < g.kh; ++i) {
        const int ih = oh * g.sh - g.ph + i;
        if (ih < 0 || ih >= H) continue;
        for (int j = 0; j < g.kw; ++j) {
            const int iw = ow * g.sw - g.pw + j;
            if (iw >= 0 && iw < W) s += (double)x[p * H * W + ih * W + iw];
        }
    }
    y[t] = (T)(s / avg_count(H, W, oh, ow, g, include_pad));
}

extern "C" __global__ void avgpool_bwd(const T* gy, T* gx, long long planes, int H, int W, int OH, int OW,
                                       int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw,
                                       bool include_pad) {
    const Win g = {kh, kw, sh, sw, ph, pw, dh, dw};
    const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (t >= planes * H * W) return;
    const long long p = t / (H * W);
    const int ih = (t / W) % H, iw = t % W;
    double acc = 0.0;
    for (int i = 0; i < g.kh; ++i) {
        const int nh = ih + g.ph - i;
        if (nh < 0 || nh % g.sh) continue;
        const int oh = nh / g.sh;
        if (oh >= OH) continue;
        for (int j = 0; j < g.kw; ++j) {
            const int nw = iw + g.pw - j;
            if (nw < 0 || nw % g.sw) continue;
            const int ow = nw / g.sw;
            if (ow >= OW) continue;
            acc += (double)gy[(p * OH + oh) * OW + ow] / avg_count(H, W, oh, ow, g, include_pad);
        }
    }
    gx[t] = (T)acc;
}
"""

_ADAPTIVE = r"""
// PyTorch's adaptive windows: output i of `out` reads [floor(i*in/out), ceil((i+1)*in/out)); the same
// formula with in and out swapped gives the outputs whose windows hold input pixel i.
__device__ int lo_of(int i, int in, int out) { return (int)((long long)i * in / out); }
__device__ int hi_of(int i, int in, int out) { return (int)(((long long)i * in + in + out - 1) / out); }

// The first maximum of window (oh, ow) in row-major order (a later element wins only if strictly greater,
// or NaN), starting at -inf on the window's first pixel as PyTorch does.
__device__ int adaptive_argmax(const T* x, int H, int W, int OH, int OW, int oh, int ow) {
    const int h0 = lo_of(oh, H, OH), w0 = lo_of(ow, W, OW);
    int best = h0 * W + w0;
    T bv = (T)(-__longlong_as_double(0x7ff0000000000000LL));
    for (int ih = h0; ih < hi_of(oh, H, OH); ++ih)
        for (int iw = w0; iw < hi_of(ow, W, OW); ++iw) {
            const T v = x[ih * W + iw];
            if (v > bv || isnan(v)) { best = ih * W + iw; bv = v; }
        }
    return best;
}

__device__ double window_size(int H, int W, int OH, int OW, int oh, int ow) {
    return (double)(hi_of(oh, H, OH) - lo_of(oh, H, OH)) * (hi_of(ow, W, OW) - lo_of(ow, W, OW));
}

extern "C" __global__ void adaptive_max_fwd(const T* x, T* y, long long planes, int H, int W, int OH, int OW) {
    const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (t >= planes * OH * OW) return;
    const T* p = x + t / (OH * OW) * H * W;
    y[t] = p[adaptive_argmax(p, H, W, OH, OW, (t / OW) % OH, t % OW)];
}

// Gather: each input pixel adds gy of every window that holds it and chose it.
extern "C" __global__ void adaptive_max_bwd(const T* x, const T* gy, T* gx, long long planes, int H, int W,
                                            int OH, int OW) {
    const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (t >= planes * H * W) return;
    const long long p = t / (H * W);
    const int ih = (t / W) % H, iw = t % W;
    double acc = 0.0;
    for (int oh = lo_of(ih, OH, H); oh < hi_of(ih, OH, H); ++oh)
        for (int ow = lo_of(iw, OW, W); ow < hi_of(iw, OW, W); ++ow)
            if (adaptive_argmax(x + p * H * W, H, W, OH, OW, oh, ow) == ih * W + iw)
                acc += (double)gy[(p * OH + oh) * OW + ow];
    gx[t] = (T)acc;
}

extern "C" __global__ void adaptive_avg_fwd(const T* x, T* y, long long planes, int H, int W, int OH, int OW) {
    const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (t >= planes * OH * OW) return;
    const T* p = x + t / (OH * OW) * H * W;
    const int oh = (t / OW) % OH, ow = t % OW;
    double s = 0.0;
    for (int ih = lo_of(oh, H, OH); ih < hi_of(oh, H, OH); ++ih)
        for (int iw = lo_of(ow, W, OW); iw < hi_of(ow, W, OW); ++iw) s += (double)p[ih * W + iw];
    y[t] = (T)(s / window_size(H, W, OH, OW, oh, ow));
}

extern "C" __global__ void adaptive_avg_bwd(const T* gy, T* gx, long long planes, int H, int W, int OH, int OW) {
    const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (t >= planes * H * W) return;
    const long long p = t / (H * W);
    const int ih = (t / W) % H, iw = t % W;
    double acc = 0.0;
    for (int oh = lo_of(ih, OH, H); oh < hi_of(ih, OH, H); ++oh)
        for (int ow = lo_of(iw, OW, W); ow < hi_of(iw, OW, W); ++ow)
            acc += (double)gy[(p * OH + oh) * OW + ow] / window_size(H, W, OH, OW, oh, ow);
    gx[t] = (T)acc;
}
"""

_relu_forward = cp.ElementwiseKernel("T x", "T y", "y = x < (T)0 ? (T)0 : x", "minidnn_relu_forward")
_relu_backward = cp.ElementwiseKernel("T y, T gy", "T gx", "gx = y > (T)0 ? gy : (T)0", "minidnn_relu_backward")
_bn_apply = cp.ElementwiseKernel(
    "T x, raw T gamma, raw T beta, raw T mean, raw T invstd, raw T res, int64 L, int64 C, bool has_g, bool has_b, "
    "bool has_res, bool relu", "T y",
    """
    const long long c = (i / L) % C;
    const double a = (double)invstd[c] * (has_g ? (double)gamma[c] : 1.0);
    const double s = (has_b ? (double)beta[c] : 0.0) - (double)mean[c] * a;
    T v = (T)((double)x * a + s);
    if (has_res) v = v + res[i];
    y = relu && v < (T)0 ? (T)0 : v;
    """, "minidnn_bn_apply")
_bn_grad = cp.ElementwiseKernel(
    "T x, T gy, raw T gamma, raw T mean, raw T invstd, raw float64 sgy, raw float64 sgyx, int64 L, int64 C, "
    "float64 M, bool has_g", "T gx",
    """
    const long long c = (i / L) % C;
    const double inv = (double)invstd[c];
    const double xhat = ((double)x - (double)mean[c]) * inv;
    const double k = (has_g ? (double)gamma[c] : 1.0) * inv / M;
    gx = (T)(k * (M * (double)gy - sgy[c] - xhat * sgyx[c]));
    """, "minidnn_bn_grad")


def _module(source, dtype):
    return cp.RawModule(code=f"typedef {_CTYPE[np.dtype(dtype)]} T;\n" + source,
                        options=("--std=c++14",))


class CudaKernels:
    """Kernels with ``minidnn._C``'s names; one instance per backend (compiled modules are cached by CuPy)."""

    def __init__(self):
        self._modules = {}

    def _fn(self, source, dtype, name):
        key = (id(source), np.dtype(dtype))
        if key not in self._modules:
            self._modules[key] = _module(source, dtype)
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
        self._check(a, b, m, inv)
        n, c = a.shape[0], a.shape[1]
        length = a.size // (n * c) if a.size else 0
        s0 = cp.empty(c, np.float64)
        s1 = cp.empty(c, np.float64) if mode == 2 else s0
        if c:
            self._fn(_REDUCE, a.dtype, "channel_reduce")(
                (c,), (_THREADS,), (a, b if b is not None else a, m if m is not None else a,
                                    inv if inv is not None else a, s0, s1, np.int64(n), np.int64(c),
                                    np.int64(length), np.int32(mode)))
        return s0, s1

    def bn_stats(self, x, mean, var):
        m = x.shape[0] * (x.size // (x.shape[0] * x.shape[1]))
        s0, _ = self._reduce(x, 0)
        mean[...] = s0 / m
        s0, _ = self._reduce(x, 1, m=mean)
        var[...] = s0 / m

    def bn_forward_train(self, x, gamma, beta, mean, invstd, y, relu=False, residual=None):
        self._check(x, gamma, beta, mean, invstd, y, residual)
        c = x.shape[1]
        _bn_apply(x, gamma if gamma is not None else mean, beta if beta is not None else mean, mean, invstd,
                  residual if residual is not None else x, np.int64(x.size // (x.shape[0] * c)), np.int64(c),
                  gamma is not None, beta is not None, residual is not None, relu, y)

    def bn_backward(self, x, gy, gamma, mean, invstd, gx, ggamma=None, gbeta=None):
        self._check(x, gy, gamma, mean, invstd, gx, ggamma, gbeta)
        n, c = x.shape[0], x.shape[1]
        length = x.size // (n * c)
        sgy, sgyx = self._reduce(gy, 2, b=x, m=mean, inv=invstd)
        _bn_grad(x, gy, gamma if gamma is not None else mean, mean, invstd, sgy, sgyx, np.int64(length), np.int64(c),
                 float(n * length), gamma is not None, gx)
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

    def _launch(self, name, total, args, dtype, source=_POOL):
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
                                   np.int32(ow)), arrays[0].dtype, _ADAPTIVE)

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
