"""The CUDA C of the CUDA backend's raw kernels, as plain strings: no CuPy needed to read them.

``kernels.py`` compiles each with ``typedef <float|double> T;`` (and, for the
reductions, ``typedef <unsigned int|long long> I;``) in front; the NVRTC test
compiles every one of them the same way, for sm_80 and sm_90, on a machine
without a GPU.
"""

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
//   mode 2: s0 = sum(a), s1 = sum(a * (b - m[c]) * inv[c]).
extern "C" __global__ void channel_partial(const T* a, const T* b, const T* m, const T* inv, double* part,
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

ADAPTIVE = r"""
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


SOURCES = {"reduce": REDUCE, "pool": POOL, "adaptive": ADAPTIVE}   # every raw module the backend compiles
INDEX_TYPES = ("unsigned int", "long long")                           # the reductions' I
