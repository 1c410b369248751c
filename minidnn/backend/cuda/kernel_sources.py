"""The CUDA C of the CUDA backend's raw kernels, as plain strings: no CuPy needed to read them.

``kernels.py`` compiles each with :func:`prelude` in front: the data type ``T``
(float, double, or mixed precision's ``__half`` and ``__nv_bfloat16``), the type
``P`` of BatchNorm's parameters and statistics (float for the 2-byte types: fp32
statistics), the type ``A`` elementwise arithmetic runs in (float for the
2-byte types) and the index type ``I``. A 2-byte value is widened exactly, the
kernel computes as its float kernel does (sums in double, elementwise in float),
and the result is rounded to ``T`` once, through float: so each kernel's bf16 or
fp16 result is its float result on the same values, rounded (round to nearest
even): the CPU backend's staging (ops.staging), without the copies. The NVRTC test compiles every
source the same way, in every data type, for sm_80 and sm_90, on a machine
without a GPU.
"""

# NumPy dtype name -> (T, P, A, the header T needs)
DTYPES = {
    "float32": ("float", "float", "float", None),
    "float64": ("double", "double", "double", None),
    "float16": ("__half", "float", "float", "cuda_fp16.h"),
    "bfloat16": ("__nv_bfloat16", "float", "float", "cuda_bf16.h"),
}
STATS = {"float32": "float32", "float64": "float64", "float16": "float32", "bfloat16": "float32"}   # P's dtype


def prelude(dtype: str, index: str = "long long") -> str:
    """The typedefs a source is compiled with for data of NumPy dtype ``dtype`` (its name)."""
    t, p, a, header = DTYPES[dtype]
    include = f"#include <{header}>\n" if header else ""
    return f"{include}typedef {t} T;\ntypedef {p} P;\ntypedef {a} A;\ntypedef {index} I;\n"


REDUCE = r"""
// Per-channel sums of a (N, C, L) array in two kernels, so that every SM has work whatever C is:
// channel_partial runs gridDim.y blocks per channel, each over its share of the channel's N * L
// values (one block per channel left most of an H200's 132 SMs idle), and channel_total adds each
// channel's partial sums in order. Fixed shares, a fixed stride per thread and a fixed tree: the
// same bits on every run, whatever GPU. I is the index type: 32-bit where the array allows (a
// 64-bit divide costs tens of instructions), and no index is divided per element: (n, l) is
// carried from one value to the thread's next.
//   mode 0: s0 = sum(a);
//   mode 1: s0 = mean(a), s1 = var(a) (biased), in one pass: sums of d = a - a[first of the channel]
//           and of d^2 (a shift near the data keeps the difference of the two well conditioned);
//   mode 2: s0 = sum(a), s1 = sum(a * (b - m[c]) * inv[c]) (m, inv: BatchNorm's statistics, in P).
extern "C" __global__ void channel_partial(const T* a, const T* b, const P* m, const P* inv, double* part,
                                           I N, I C, I L, I share, int mode) {
    __shared__ double r0[256], r1[256];
    const I c = blockIdx.x, j = blockIdx.y, total = N * L;
    const I begin = j * share;
    const I end = begin + share < total ? begin + share : total;
    const double shift = mode == 1 ? (double)a[c * L] : 0.0;
    const double mc = mode == 2 ? (double)m[c] : 0.0;
    const double ic = mode == 2 ? (double)inv[c] : 0.0;
    const I first = begin + threadIdx.x;
    const I step_n = blockDim.x / L, step_l = blockDim.x - step_n * L;
    I n = first / L, l = first - n * L;
    double acc0 = 0.0, acc1 = 0.0;
    for (I k = first; k < end; k += blockDim.x) {
        const I idx = (n * C + c) * L + l;
        const double v = (double)a[idx];
        if (mode == 1) {
            const double d = v - shift;
            acc0 += d;
            acc1 += d * d;
        } else {
            acc0 += v;
            if (mode == 2) acc1 += v * ((double)b[idx] - mc) * ic;
        }
        n += step_n;
        l += step_l;
        if (l >= L) { l -= L; ++n; }
    }
    r0[threadIdx.x] = acc0; r1[threadIdx.x] = acc1;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) { r0[threadIdx.x] += r0[threadIdx.x + s]; r1[threadIdx.x] += r1[threadIdx.x + s]; }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        part[(c * gridDim.y + j) * 2] = r0[0];
        part[(c * gridDim.y + j) * 2 + 1] = r1[0];
    }
}

extern "C" __global__ void channel_total(const T* a, const double* part, double* s0, double* s1, I C, I L, I S,
                                         double M, int mode) {
    const I c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double t0 = 0.0, t1 = 0.0;
    for (I j = 0; j < S; ++j) {
        t0 += part[(c * S + j) * 2];
        t1 += part[(c * S + j) * 2 + 1];
    }
    if (mode == 1) {
        const double d = t0 / M;
        s0[c] = (double)a[c * L] + d;
        const double var = t1 / M - d * d;
        s1[c] = var > 0.0 ? var : 0.0;
    } else {
        s0[c] = t0;
        if (mode == 2) s1[c] = t1;
    }
}
"""

POOL = r"""
struct Win { int kh, kw, sh, sw, ph, pw, dh, dw; };

// The first maximum of window (oh, ow) in row-major order (a later element wins only if strictly
// greater, or NaN); -1 if every tap is padding. Compared as doubles: exact for every T.
__device__ int window_argmax(const T* x, int H, int W, int oh, int ow, Win g) {
    int best = -1; double bv = 0.0;
    for (int i = 0; i < g.kh; ++i) {
        const int ih = oh * g.sh - g.ph + i * g.dh;
        if (ih < 0 || ih >= H) continue;
        for (int j = 0; j < g.kw; ++j) {
            const int iw = ow * g.sw - g.pw + j * g.dw;
            if (iw < 0 || iw >= W) continue;
            const double v = (double)x[ih * W + iw];
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
    gx[t] = (T)(A)acc;
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
    y[t] = (T)(A)(s / avg_count(H, W, oh, ow, g, include_pad));
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
    gx[t] = (T)(A)acc;
}
"""

ADAPTIVE = r"""
// PyTorch's adaptive windows: output i of `out` reads [floor(i*in/out), ceil((i+1)*in/out)); the same
// formula with in and out swapped gives the outputs whose windows hold input pixel i.
__device__ int lo_of(int i, int in, int out) { return (int)((long long)i * in / out); }
__device__ int hi_of(int i, int in, int out) { return (int)(((long long)i * in + in + out - 1) / out); }

// The first maximum of window (oh, ow) in row-major order (a later element wins only if strictly greater,
// or NaN), starting at -inf on the window's first pixel as PyTorch does. Compared as doubles (exact).
__device__ int adaptive_argmax(const T* x, int H, int W, int OH, int OW, int oh, int ow) {
    const int h0 = lo_of(oh, H, OH), w0 = lo_of(ow, W, OW);
    int best = h0 * W + w0;
    double bv = -__longlong_as_double(0x7ff0000000000000LL);
    for (int ih = h0; ih < hi_of(oh, H, OH); ++ih)
        for (int iw = w0; iw < hi_of(ow, W, OW); ++iw) {
            const double v = (double)x[ih * W + iw];
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
    gx[t] = (T)(A)acc;
}

extern "C" __global__ void adaptive_avg_fwd(const T* x, T* y, long long planes, int H, int W, int OH, int OW) {
    const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (t >= planes * OH * OW) return;
    const T* p = x + t / (OH * OW) * H * W;
    const int oh = (t / OW) % OH, ow = t % OW;
    double s = 0.0;
    for (int ih = lo_of(oh, H, OH); ih < hi_of(oh, H, OH); ++ih)
        for (int iw = lo_of(ow, W, OW); iw < hi_of(ow, W, OW); ++iw) s += (double)p[ih * W + iw];
    y[t] = (T)(A)(s / window_size(H, W, OH, OW, oh, ow));
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
    gx[t] = (T)(A)acc;
}
"""

ELEMENTWISE = r"""
// One thread per element, i < n; c = (i / L) % C is the channel of NCHW element i (L = H * W).

// y = x < 0 ? 0 : x (NaN and -0 pass): the select bn_apply(relu) makes, so the two give the same bits.
extern "C" __global__ void relu_fwd(const T* x, T* y, I n) {
    const I i = blockIdx.x * (I)blockDim.x + threadIdx.x;
    if (i >= n) return;
    y[i] = (A)x[i] < (A)0 ? (T)(A)0 : x[i];
}

extern "C" __global__ void relu_bwd(const T* y, const T* gy, T* gx, I n) {
    const I i = blockIdx.x * (I)blockDim.x + threadIdx.x;
    if (i >= n) return;
    gx[i] = (A)y[i] > (A)0 ? gy[i] : (T)(A)0;
}

// y = x * a + s per channel (a = invstd * gamma, s = beta - mean * a, in double), rounded to A, then
// + res (add's rounding, in A) and the ReLU's select, rounded to T once.
extern "C" __global__ void bn_apply(const T* x, const P* gamma, const P* beta, const P* mean, const P* invstd,
                                    const T* res, T* y, I n, I L, I C, int has_g, int has_b, int has_res,
                                    int relu) {
    const I i = blockIdx.x * (I)blockDim.x + threadIdx.x;
    if (i >= n) return;
    const I c = (i / L) % C;
    const double a = (double)invstd[c] * (has_g ? (double)gamma[c] : 1.0);
    const double s = (has_b ? (double)beta[c] : 0.0) - (double)mean[c] * a;
    A v = (A)((double)x[i] * a + s);
    if (has_res) v = v + (A)res[i];
    y[i] = (T)(relu && v < (A)0 ? (A)0 : v);
}

// BatchNorm's input gradient from the per-channel float64 sums of gy (sgy) and gy * xhat (sgyx).
extern "C" __global__ void bn_grad(const T* x, const T* gy, const P* gamma, const P* mean, const P* invstd,
                                   const double* sgy, const double* sgyx, T* gx, I n, I L, I C, double M,
                                   int has_g) {
    const I i = blockIdx.x * (I)blockDim.x + threadIdx.x;
    if (i >= n) return;
    const I c = (i / L) % C;
    const double inv = (double)invstd[c];
    const double xhat = ((double)x[i] - (double)mean[c]) * inv;
    const double k = (has_g ? (double)gamma[c] : 1.0) * inv / M;
    gx[i] = (T)(A)(k * (M * (double)gy[i] - sgy[c] - xhat * sgyx[c]));
}
"""


SOURCES = {"reduce": REDUCE, "pool": POOL, "adaptive": ADAPTIVE, "elementwise": ELEMENTWISE}   # every raw module
INDEX_TYPES = ("unsigned int", "long long")                           # I: 32-bit where the array allows
