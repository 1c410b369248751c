// Convolution as an implicit GEMM over zero-padded copies, with AVX-512 FMA:
// forward, backward-data (stride 1) and backward-filter.
//
// Forward and backward-data share two kernels. The input (x, or gy for the
// data gradient) is first copied into the workspace with its padding made
// explicit, each plane Hp x Wp (with stride s, split into s x s phase planes:
// see pad_phases), and the filter is laid out for the kernel
// (backward-data is the forward of gy padded by d*(k-1) - p with the filter
// flipped and its channel axes swapped).
//
// The plane kernel: on a padded plane every tap (i, j) of every output
// (oh, ow) reads the input at q + i*dh*Wp + j*dw, q = oh*Wp + ow: the outputs
// run as one long row of OH*Wp positions, of which the last Wp - OW of each
// row are not outputs and are dropped when stored. A register block holds
// 6 output channels x 4 vectors of 16 positions; per (input channel, tap) it
// loads the 4 vectors and broadcasts 6 weights. The valid lanes of a vector
// are stored with a compress-store, which writes them to consecutive outputs.
// The channel kernel (see channel_range) serves planes whose padded rows
// would leave vectors of positions mostly empty.
//
// Backward-filter copies x into the workspace as padded planes of 16 channels
// (N, G, C/16, Hp, Wp, 16): gw[o, c:c+16, t] accumulates gy[n, o, q]
// (broadcast) times 16 channels of x at q's tap t, for OB output channels x NT
// taps in registers; each sample's sum is added to a running total, and the
// lanes are scattered into gw at the end of each chunk of samples.
//
// Every output element is summed by one thread in a fixed order: the results
// do not depend on the number of threads. They differ from the other
// algorithms' in rounding only (FMA). The kernels run where the CPU has
// AVX-512F; conv2d_implicit_available() says whether it does.
#include "conv_direct.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define MINIDNN_AVX512 1
#define AVX512 __attribute__((target("avx512f,fma")))
#endif

namespace minidnn {
namespace {

constexpr int kL = 16;              // float lanes of a vector
constexpr index_t kMaxR = 4;        // vectors per register block (forward)

index_t slack(index_t kw, index_t dw) { return kMaxR * kL + (kw - 1) * dw + kL; }

constexpr int kP = 6;                // the channel kernel's block: output positions
constexpr int kVB = 4;               // ... x vectors of 16 output channels
constexpr index_t kCChunk = 8;       // ... summed over chunks of input channels

// Whether vectors of positions along a plane's padded rows (OH x Wp) would be mostly padding, so
// the channel kernel runs instead of the plane kernel.
bool use_channels(index_t OH, index_t OW, index_t Wp) {
    const index_t nvec = (OH * Wp + kL - 1) / kL;
    return 8 * OH * OW < 7 * nvec * kL;
}

// Floats of the channel kernel's partial sums: every block of positions x one block of channels.
index_t channel_temp(index_t N, index_t OH, index_t OW, index_t Wp) {
    return use_channels(OH, OW, Wp) ? (N * OH * OW + kP - 1) / kP * kP * kVB * kL : 0;
}

// out[n, gi*Co + o, q] = sum over c < Ci, t < K of W(gi, o, c, t) * in[n, gi*Ci + c, q + off[t]],
// W(gi, o, c, t) = w[wbase + gi*wg + o*so + c*si + t*st].
struct Plane {
    index_t N, G, Ci, Co, cs, Wp, OH, OW, K;   // cs: floats per input channel; Wp: a row's width
    std::vector<index_t> off;
    const float* w;
    index_t wbase, wg, so, si, st;
    const float* in;       // (N, G*Ci, cs) + slack
    float* wr;             // the filter laid out for the kernel that runs (G*Ci*Co*K floats)
    float* temp;           // the channel kernel's partial sums (channel_temp floats)
    const float* bias;     // (G*Co,) or null
    float* out;            // (N, G*Co, OH, OW)
    index_t nvec;          // vectors of 16 positions covering OH*Wp
    std::vector<unsigned short> mask;   // per vector, its lanes that are outputs
    std::vector<index_t> dst;           // per vector, the output index of its first output lane
};

void plane_tables(Plane& p) {
    p.nvec = (p.OH * p.Wp + kL - 1) / kL;
    p.mask.assign(p.nvec, 0);
    p.dst.assign(p.nvec, 0);
    for (index_t v = 0; v < p.nvec; ++v) {
        const index_t q0 = v * kL;
        p.dst[v] = (q0 / p.Wp) * p.OW + std::min(q0 % p.Wp, p.OW);
        for (int l = 0; l < kL; ++l) {
            const index_t q = q0 + l;
            if (q < p.OH * p.Wp && q % p.Wp < p.OW) p.mask[v] |= static_cast<unsigned short>(1u << l);
        }
    }
}

// src (N, C, H, W) padded by (ph, pw) and split into sh*sw phase planes of Hq x Wq, phase (a, b)
// holding the padded pixels (u*sh + a, v*sw + b); then the slack after them zeroed. A tap (i, j)
// of output (oh, ow) reads phase ((i*dh) % sh, (j*dw) % sw) at (oh + i*dh / sh, ow + j*dw / sw):
// a stride-1 access on a plane of rows Wq wide. At stride 1 there is one phase, the padded plane.
void pad_phases(const float* src, float* dst, index_t NC, index_t H, index_t W, index_t ph, index_t pw,
                index_t sh, index_t sw, index_t extra) {
    const index_t Hq = (H + 2 * ph + sh - 1) / sh, Wq = (W + 2 * pw + sw - 1) / sw, cs = sh * sw * Hq * Wq;
    MINIDNN_OMP_FOR(NC * cs >= kParallelGrain && NC > 1)
    for (index_t nc = 0; nc < NC; ++nc) {
        const float* s = src + nc * H * W;
        float* d = dst + nc * cs;
        for (index_t a = 0; a < sh; ++a)
            for (index_t b = 0; b < sw; ++b) {
                // the columns v whose pixel w = v*sw + b - pw lies in [0, W)
                const index_t v0 = std::min(Wq, pw > b ? (pw - b + sw - 1) / sw : index_t(0));
                const index_t last = W - 1 + pw - b;
                const index_t v1 = std::max(v0, last >= 0 ? std::min(Wq, last / sw + 1) : index_t(0));
                for (index_t u = 0; u < Hq; ++u) {
                    float* row = d + ((a * sw + b) * Hq + u) * Wq;
                    const index_t h = u * sh + a - ph;
                    if (h < 0 || h >= H) {
                        std::memset(row, 0, sizeof(float) * Wq);
                        continue;
                    }
                    std::memset(row, 0, sizeof(float) * v0);
                    std::memset(row + v1, 0, sizeof(float) * (Wq - v1));
                    const float* sr = s + h * W + b - pw;
                    if (sw == 1)
                        std::memcpy(row + v0, sr + v0, sizeof(float) * (v1 - v0));
                    else
                        for (index_t v = v0; v < v1; ++v) row[v] = sr[v * sw];
                }
            }
    }
    std::memset(dst + NC * cs, 0, sizeof(float) * extra);
}

#ifdef MINIDNN_AVX512
// The vectors of every sample's plane in one list, n * nvec + v: a block of R of them may span
// samples, so short planes fill register blocks as long ones do. Items are (group, block of
// vectors, block of channels). With weights_inner the blocks of channels vary fastest: a block of
// vectors is read from the caches for all of them, and the filter is streamed once per block of
// vectors; otherwise the vectors vary fastest under one block of the filter, and the input is
// streamed once per block of channels.
template <int OB, int R>
AVX512 void plane_item(const Plane& p, index_t it, bool weights_inner) {
    const index_t nob = (p.Co + OB - 1) / OB, nvb = (p.N * p.nvec + R - 1) / R;
    index_t ob_i, vb, gi;
    if (weights_inner)
        ob_i = it % nob, vb = (it / nob) % nvb, gi = it / (nob * nvb);
    else
        vb = it % nvb, ob_i = (it / nvb) % nob, gi = it / (nvb * nob);
    const index_t o0 = ob_i * OB, HpWp = p.cs, last = p.N * p.nvec - 1;
    const int ob = static_cast<int>(std::min<index_t>(OB, p.Co - o0));
    const float* xs[R];          // vector r of the block, at channel 0 (the last vector repeats past the end)
    MINIDNN_UNROLL
    for (int r = 0; r < R; ++r) {
        const index_t e = std::min(vb * R + r, last), n = e / p.nvec, v = e % p.nvec;
        xs[r] = p.in + (n * p.G + gi) * p.Ci * HpWp + v * kL;
    }
    const float* wo[OB];
    for (int o = 0; o < OB; ++o) wo[o] = p.w + p.wbase + gi * p.wg + (o0 + std::min(o, ob - 1)) * p.so;
    __m512 acc[OB][R];
    MINIDNN_UNROLL
    for (int o = 0; o < OB; ++o)
        MINIDNN_UNROLL
        for (int r = 0; r < R; ++r) acc[o][r] = _mm512_setzero_ps();
    const index_t* off = p.off.data();
    for (index_t c = 0; c < p.Ci; ++c) {
        const float* wc[OB];
        MINIDNN_UNROLL
        for (int o = 0; o < OB; ++o) wc[o] = wo[o] + c * p.si;
        const index_t xc = c * HpWp;
        for (index_t t = 0; t < p.K; ++t) {
            const index_t xt = xc + off[t];
            __m512 xv[R];
            MINIDNN_UNROLL
            for (int r = 0; r < R; ++r) xv[r] = _mm512_loadu_ps(xs[r] + xt);
            const index_t wt = t * p.st;
            MINIDNN_UNROLL
            for (int o = 0; o < OB; ++o) {
                const __m512 wv = _mm512_set1_ps(wc[o][wt]);
                MINIDNN_UNROLL
                for (int r = 0; r < R; ++r) acc[o][r] = _mm512_fmadd_ps(wv, xv[r], acc[o][r]);
            }
        }
    }
    const index_t OHW = p.OH * p.OW;
    MINIDNN_UNROLL
    for (int r = 0; r < R; ++r) {
        const index_t e = vb * R + r, n = e / p.nvec, v = e % p.nvec;
        if (e > last) break;
        for (int o = 0; o < ob; ++o) {
            __m512 a = acc[o][r];
            if (p.bias) a = _mm512_add_ps(a, _mm512_set1_ps(p.bias[gi * p.Co + o0 + o]));
            float* y = p.out + ((n * p.G + gi) * p.Co + o0 + o) * OHW;
            _mm512_mask_compressstoreu_ps(y + p.dst[v], static_cast<__mmask16>(p.mask[v]), a);
        }
    }
}

template <int OB, int R>
AVX512 void plane_items(const Plane& p) {
    const index_t nvb = (p.N * p.nvec + R - 1) / R, nob = (p.Co + OB - 1) / OB;
    const index_t items = p.G * nvb * nob;
    const double filter_traffic = double(nvb) * p.Co * p.Ci * p.K;      // floats read per group
    const double input_traffic = double(nob) * p.N * p.Ci * p.cs;
    const bool weights_inner = filter_traffic <= input_traffic;
    MINIDNN_OMP_FOR(items > 1)
    for (index_t it = 0; it < items; ++it) plane_item<OB, R>(p, it, weights_inner);
}
#endif

#ifdef MINIDNN_AVX512
// The channel kernel, for planes too small to fill vectors of positions: a register block is kP
// output positions (n, oh, ow), anywhere in the batch, x kVB vectors of 16 output channels; per
// (input channel, tap) it broadcasts kP inputs and loads kVB vectors of the filter, laid out as
// (G, Ci, K, Co). The input channels are taken kCChunk at a time, so that the chunk's filter stays
// in the first-level cache while every block of positions passes: the partial sums go to temp
// between chunks, and the last chunk scatters them into the output. A thread owns a range of
// position blocks.
template <bool FULL>   // every block of output channels fills its kVB vectors
AVX512 void channel_range(const Plane& p, index_t pb0, index_t pb1) {
    const index_t OHW = p.OH * p.OW, NP = p.N * OHW, HpWp = p.cs;
    const index_t* off = p.off.data();
    const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32(static_cast<int>(OHW)));
    for (index_t gi = 0; gi < p.G; ++gi) {
        for (index_t o0 = 0; o0 < p.Co; o0 += kVB * kL) {
            __mmask16 om[kVB];
            for (int v = 0; v < kVB; ++v) {
                const index_t lanes = std::max<index_t>(0, std::min<index_t>(kL, p.Co - o0 - v * kL));
                om[v] = static_cast<__mmask16>((1u << lanes) - 1u);
            }
            for (index_t c0 = 0; c0 < p.Ci; c0 += kCChunk) {
                const index_t c1 = std::min(p.Ci, c0 + kCChunk);
                const float* wchunk = p.wr + (gi * p.Ci + c0) * p.K * p.Co + o0;
                for (index_t pb = pb0; pb < pb1; ++pb) {
                    const float* xs[kP];
                    for (int q = 0; q < kP; ++q) {
                        const index_t e = std::min(pb * kP + q, NP - 1), n = e / OHW, r = e % OHW;
                        xs[q] = p.in + (n * p.G + gi) * p.Ci * HpWp + (r / p.OW) * p.Wp + r % p.OW;
                    }
                    float* tp = p.temp + pb * kP * kVB * kL;
                    __m512 acc[kP][kVB];
                    MINIDNN_UNROLL
                    for (int q = 0; q < kP; ++q)
                        MINIDNN_UNROLL
                        for (int v = 0; v < kVB; ++v)
                            acc[q][v] = c0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(tp + (q * kVB + v) * kL);
                    for (index_t c = c0; c < c1; ++c) {
                        const index_t xc = c * HpWp;
                        const float* wc = wchunk + (c - c0) * p.K * p.Co;
                        for (index_t t = 0; t < p.K; ++t) {
                            const index_t xt = xc + off[t];
                            __m512 wv[kVB];
                            MINIDNN_UNROLL
                            for (int v = 0; v < kVB; ++v)
                                wv[v] = FULL ? _mm512_loadu_ps(wc + t * p.Co + v * kL)
                                             : _mm512_maskz_loadu_ps(om[v], wc + t * p.Co + v * kL);
                            MINIDNN_UNROLL
                            for (int q = 0; q < kP; ++q) {
                                const __m512 xb = _mm512_set1_ps(xs[q][xt]);
                                MINIDNN_UNROLL
                                for (int v = 0; v < kVB; ++v) acc[q][v] = _mm512_fmadd_ps(xb, wv[v], acc[q][v]);
                            }
                        }
                    }
                    if (c1 < p.Ci) {
                        MINIDNN_UNROLL
                        for (int q = 0; q < kP; ++q)
                            MINIDNN_UNROLL
                            for (int v = 0; v < kVB; ++v) _mm512_storeu_ps(tp + (q * kVB + v) * kL, acc[q][v]);
                        continue;
                    }
                    MINIDNN_UNROLL   // fully: the accumulators stay in registers only if indexed by constants
                    for (int q = 0; q < kP; ++q) {
                        const index_t e = pb * kP + q;
                        if (e >= NP) continue;
                        float* y = p.out + ((e / OHW * p.G + gi) * p.Co + o0) * OHW + e % OHW;
                        MINIDNN_UNROLL
                        for (int v = 0; v < kVB; ++v) {
                            __m512 a = acc[q][v];
                            if (p.bias)
                                a = _mm512_add_ps(a, _mm512_maskz_loadu_ps(om[v], p.bias + gi * p.Co + o0 + v * kL));
                            _mm512_mask_i32scatter_ps(y + v * kL * OHW, om[v], idx, a, 4);
                        }
                    }
                }
            }
        }
    }
}

void channel_items(const Plane& p) {
    const index_t npb = (p.N * p.OH * p.OW + kP - 1) / kP;
    const index_t nt = std::max<index_t>(1, std::min<index_t>(get_num_threads(), npb));
    MINIDNN_OMP_FOR(nt > 1)
    for (index_t t = 0; t < nt; ++t) {
        if (p.Co % (kVB * kL) == 0)
            channel_range<true>(p, npb * t / nt, npb * (t + 1) / nt);
        else
            channel_range<false>(p, npb * t / nt, npb * (t + 1) / nt);
    }
}
#endif

// wr = W(gi, o, c, t) as (G, Co, Ci, K) for the plane kernel (each output channel's filter in one
// run), or as (G, Ci, K, Co) for the channel kernel. The data pass reads w flipped and with its
// channel axes swapped.
void relayout(const Plane& p, bool channels_last) {
    const index_t GC = p.G * p.Ci;
    MINIDNN_OMP_FOR(GC * p.Co * p.K >= kParallelGrain && GC > 1)
    for (index_t gc = 0; gc < GC; ++gc) {
        const index_t gi = gc / p.Ci, c = gc % p.Ci;
        for (index_t o = 0; o < p.Co; ++o) {
            const float* src = p.w + p.wbase + gi * p.wg + o * p.so + c * p.si;
            for (index_t t = 0; t < p.K; ++t) {
                const float v = src[t * p.st];
                if (channels_last)
                    p.wr[((gi * p.Ci + c) * p.K + t) * p.Co + o] = v;
                else
                    p.wr[((gi * p.Co + o) * p.Ci + c) * p.K + t] = v;
            }
        }
    }
}

void run_plane(Plane& p) {
#ifdef MINIDNN_AVX512
    if (use_channels(p.OH, p.OW, p.Wp)) {
        relayout(p, true);
        channel_items(p);
        return;
    }
    plane_tables(p);
    const bool laid_out = p.wbase == 0 && p.st == 1 && p.si == p.K && p.so == p.Ci * p.K &&
                          p.wg == p.Co * p.Ci * p.K;   // the forward's w already is
    if (!laid_out) {
        relayout(p, false);
        p.w = p.wr, p.wbase = 0, p.wg = p.Co * p.Ci * p.K, p.so = p.Ci * p.K, p.si = p.K, p.st = 1;
    }
    plane_items<6, 4>(p);
#else
    (void)p;
    throw py::value_error("the implicit convolution needs an x86-64 CPU with AVX-512");
#endif
}

#ifdef MINIDNN_AVX512
// ------------------------------------------------------------ backward-filter
struct Rows {
    index_t N, G, Cg, Og, CB, O, Hp, Wp, OH, OW, K, sh, sw;   // CB: blocks of 16 channels per group
    std::vector<index_t> off;   // per tap, its offset in a block's plane
    const float* xr;            // (N, G, CB, Hp, Wp, 16)
    const float* gy;            // (N, O, OH, OW)
    float* gw;                  // (O, Cg, K)
};

// x (N, G*Cg, H, W) into xr (N, G, CB, H + 2*ph, W + 2*pw, 16): planes of 16 channels' pixels, zero
// borders and zero channels past Cg. A block's pixels lie 64 bytes apart, so every tap of a row of
// outputs reads consecutive cache lines.
void pad_blocks(const float* x, float* xr, const Rows& p, index_t H, index_t W, index_t ph, index_t pw) {
    const index_t planes = p.N * p.G * p.CB, HpWp = p.Hp * p.Wp;
    MINIDNN_OMP_FOR(planes * HpWp * kL >= kParallelGrain && planes > 1)
    for (index_t b = 0; b < planes; ++b) {
        const index_t cb = b % p.CB, gi = (b / p.CB) % p.G, n = b / (p.CB * p.G);
        float* d = xr + b * HpWp * kL;
        std::memset(d, 0, sizeof(float) * HpWp * kL);
        const index_t c0 = cb * kL, lanes = std::min<index_t>(kL, p.Cg - c0);
        const float* s = x + ((n * p.G + gi) * p.Cg + c0) * H * W;
        for (index_t h = 0; h < H; ++h) {            // row by row: the writes stay within one row
            float* row = d + ((h + ph) * p.Wp + pw) * kL;
            for (index_t l = 0; l < lanes; ++l)
                for (index_t w = 0; w < W; ++w) row[w * kL + l] = s[(l * H + h) * W + w];
        }
    }
}

template <int OB, int NT>
AVX512 void rows_item(const Rows& p, index_t it, index_t t0, index_t n0, index_t n1) {
    const index_t ncb = (p.Cg + kL - 1) / kL, nob = (p.Og + OB - 1) / OB;
    const index_t ob_i = it % nob, cb = (it / nob) % ncb, gi = it / (nob * ncb);
    const index_t o0 = ob_i * OB, c0 = cb * kL;
    const int ob = static_cast<int>(std::min<index_t>(OB, p.Og - o0));
    const int lanes = static_cast<int>(std::min<index_t>(kL, p.Cg - c0));
    const __mmask16 cm = static_cast<__mmask16>((1u << lanes) - 1u);
    const index_t OHW = p.OH * p.OW;
    index_t off[NT];
    MINIDNN_UNROLL
    for (int t = 0; t < NT; ++t) off[t] = p.off[t0 + t];
    __m512 total[OB][NT];
    MINIDNN_UNROLL
    for (int o = 0; o < OB; ++o)
        MINIDNN_UNROLL
        for (int t = 0; t < NT; ++t) total[o][t] = _mm512_setzero_ps();
    for (index_t n = n0; n < n1; ++n) {
        const float* gyo[OB];
        for (int o = 0; o < OB; ++o) gyo[o] = p.gy + (n * p.O + gi * p.Og + o0 + std::min(o, ob - 1)) * OHW;
        const float* xn = p.xr + ((n * p.G + gi) * p.CB + cb) * p.Hp * p.Wp * kL;
        __m512 acc[OB][NT];
        MINIDNN_UNROLL
        for (int o = 0; o < OB; ++o)
            MINIDNN_UNROLL
            for (int t = 0; t < NT; ++t) acc[o][t] = _mm512_setzero_ps();
        for (index_t oh = 0; oh < p.OH; ++oh) {
            for (index_t ow = 0; ow < p.OW; ++ow) {
                const index_t q = oh * p.OW + ow;
                const float* xq = xn + (oh * p.sh * p.Wp + ow * p.sw) * kL;
                __m512 gv[OB];
                MINIDNN_UNROLL
                for (int o = 0; o < OB; ++o) gv[o] = _mm512_set1_ps(gyo[o][q]);
                MINIDNN_UNROLL
                for (int t = 0; t < NT; ++t) {
                    const __m512 xv = _mm512_loadu_ps(xq + off[t]);
                    MINIDNN_UNROLL
                    for (int o = 0; o < OB; ++o) acc[o][t] = _mm512_fmadd_ps(gv[o], xv, acc[o][t]);
                }
            }
        }
        MINIDNN_UNROLL
        for (int o = 0; o < OB; ++o)
            MINIDNN_UNROLL
            for (int t = 0; t < NT; ++t) total[o][t] = _mm512_add_ps(total[o][t], acc[o][t]);
    }
    const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32(static_cast<int>(p.K)));
    for (int o = 0; o < ob; ++o) {
        float* g = p.gw + ((gi * p.Og + o0 + o) * p.Cg + c0) * p.K + t0;
        MINIDNN_UNROLL
        for (int t = 0; t < NT; ++t) {
            __m512 v = total[o][t];
            if (n0 > 0) v = _mm512_add_ps(_mm512_mask_i32gather_ps(_mm512_setzero_ps(), cm, idx, g + t, 4), v);
            _mm512_mask_i32scatter_ps(g + t, cm, idx, v, 4);
        }
    }
}

// Samples in chunks whose plane of one block of channels stays in the core's cache (256 KiB) while
// every block of output channels reads it; gw sums the chunks in order.
template <int OB, int NT>
AVX512 void rows_items(const Rows& p, index_t t0) {
    const index_t items = p.G * p.CB * ((p.Og + OB - 1) / OB);
    const index_t chunk = std::max<index_t>(1, (index_t(256) << 10) / (p.Hp * p.Wp * kL * index_t(sizeof(float))));
    for (index_t n0 = 0; n0 < p.N; n0 += chunk) {
        const index_t n1 = std::min(p.N, n0 + chunk);
        MINIDNN_OMP_FOR(items > 1)
        for (index_t it = 0; it < items; ++it) rows_item<OB, NT>(p, it, t0, n0, n1);
    }
}

// Taps in groups of up to 9, with as many output channels as keep 27 accumulators or fewer.
void run_rows(const Rows& p) {
    for (index_t t0 = 0; t0 < p.K; t0 += 9) {
        switch (std::min<index_t>(9, p.K - t0)) {
            case 1: rows_items<16, 1>(p, t0); break;
            case 2: rows_items<12, 2>(p, t0); break;
            case 3: rows_items<8, 3>(p, t0); break;
            case 4: rows_items<6, 4>(p, t0); break;
            case 5: rows_items<5, 5>(p, t0); break;
            case 6: rows_items<4, 6>(p, t0); break;
            case 7: rows_items<3, 7>(p, t0); break;
            case 8: rows_items<3, 8>(p, t0); break;
            default: rows_items<3, 9>(p, t0); break;
        }
    }
}
#else
void run_rows(const Rows&) { throw py::value_error("the implicit convolution needs an x86-64 CPU with AVX-512"); }
#endif

bool available() {
#ifdef MINIDNN_AVX512
    static const bool yes = __builtin_cpu_supports("avx512f");
    return yes;
#else
    return false;
#endif
}

void require_available() {
    require(available(), "the implicit convolution needs a CPU with AVX-512F (conv2d_implicit_available())");
}

ConvGeom implicit_geom(const py::array& x, const py::array& w, const py::array& y, index_t sh, index_t sw,
                       index_t ph, index_t pw, index_t dh, index_t dw, index_t groups, const char* xn,
                       const char* yn) {
    require_available();
    return conv_geom(x, w, y, sh, sw, ph, pw, dh, dw, groups, xn, yn);
}

// One pass's arrays, each checked: two read, one written, the workspace.
struct Arrays {
    py::array_t<float, py::array::c_style> a, b, out, ws;
};

Arrays checked_arrays(py::handle a, const char* an, py::handle b, const char* bn, py::handle out, const char* on,
                      py::handle ws) {
    return {checked<float>(a, an, false), checked<float>(b, bn, false), checked<float>(out, on, true),
            checked<float>(ws, "ws", true)};
}

// The workspace holds what the pass (role 0 forward, 1 backward-data, 2 backward-filter) needs, and
// neither it nor the output overlaps anything else.
void check_pass(const ConvGeom& g, int role, const py::array& ws, const py::array& out, const char* on,
                std::initializer_list<std::pair<const py::array*, const char*>> ins) {
    static const char* const what[] = {"forward", "backward-data", "backward-filter"};
    const index_t floats = conv2d_implicit_workspace(g.N, g.C, g.H, g.W, g.O, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw,
                                                     g.dh, g.dw, g.G, role);
    require(ws.size() >= floats, std::string("workspace of ") + std::to_string(ws.size()) +
                                     " floats is too small for the implicit " + what[role] + " (needs " +
                                     std::to_string(floats) + ")");
    check_no_overlap(ws, "ws", out, on);
    for (const auto& [a, n] : ins) {
        check_no_overlap(*a, n, out, on);
        check_no_overlap(ws, "ws", *a, n);
    }
}

// The forward's input planes: padded (Hp, Wp), split into sh x sw phases of (Hq, Wq).
struct Phases {
    index_t Hq, Wq, cs;   // cs: floats per channel
    Phases(index_t H, index_t W, index_t sh, index_t sw, index_t ph, index_t pw)
        : Hq((H + 2 * ph + sh - 1) / sh), Wq((W + 2 * pw + sw - 1) / sw), cs(sh * sw * Hq * Wq) {}
};

// Per tap (i, j), its offset from an output's position: phase ((i*dh) % sh, (j*dw) % sw), then
// (i*dh / sh) rows of Wq and (j*dw / sw) columns.
std::vector<index_t> plane_offsets(const ConvGeom& g, const Phases& f) {
    std::vector<index_t> off;
    for (index_t i = 0; i < g.kh; ++i)
        for (index_t j = 0; j < g.kw; ++j) {
            const index_t r = i * g.dh, c = j * g.dw;
            off.push_back(((r % g.sh) * g.sw + c % g.sw) * f.Hq * f.Wq + (r / g.sh) * f.Wq + c / g.sw);
        }
    return off;
}

}  // namespace

bool conv2d_implicit_available() { return available(); }

index_t conv2d_implicit_workspace(index_t N, index_t C, index_t H, index_t W, index_t O, index_t kh,
                                  index_t kw, index_t sh, index_t sw, index_t ph, index_t pw, index_t dh,
                                  index_t dw, index_t groups, int role) {
    const index_t filter = O * (C / groups) * kh * kw;
    const index_t OH = (H + 2 * ph - dh * (kh - 1) - 1) / sh + 1, OW = (W + 2 * pw - dw * (kw - 1) - 1) / sw + 1;
    if (role == 0) {
        const Phases f(H, W, sh, sw, ph, pw);
        return N * C * f.cs + slack(kw, dw) + channel_temp(N, OH, OW, f.Wq) + filter;
    }
    if (role == 1) {
        const index_t qh = dh * (kh - 1) - ph, qw = dw * (kw - 1) - pw;
        return N * O * (OH + 2 * qh) * (OW + 2 * qw) + slack(kw, dw) + channel_temp(N, H, W, OW + 2 * qw) + filter;
    }
    return N * groups * ((C / groups + kL - 1) / kL) * kL * (H + 2 * ph) * (W + 2 * pw);
}

void conv2d_implicit_forward(py::object xo, py::object wo, py::object bo, py::object yo, py::object wso,
                             index_t sh, index_t sw, index_t ph, index_t pw, index_t dh, index_t dw,
                             index_t groups) {
    auto [x, w, y, ws] = checked_arrays(xo, "x", wo, "w", yo, "y", wso);
    const ConvGeom g = implicit_geom(x, w, y, sh, sw, ph, pw, dh, dw, groups, "x", "y");
    const float* bias = checked_bias<float>(bo, g.O, y);
    check_pass(g, 0, ws, y, "y", {{&x, "x"}, {&w, "w"}});
    const Phases f(g.H, g.W, sh, sw, ph, pw);
    float* pad = ws.mutable_data();
    Plane p{g.N, g.G, g.Cg, g.Og, f.cs, f.Wq, g.OH, g.OW, g.K(), plane_offsets(g, f), w.data(), 0,
            g.Og * g.Cg * g.K(), g.Cg * g.K(), g.K(), 1, pad, pad + (ws.size() - w.size()),
            pad + g.N * g.C * f.cs + slack(g.kw, g.dw), bias, y.mutable_data(), 0, {}, {}};
    const float* xs = x.data();
    py::gil_scoped_release nogil;
    pad_phases(xs, pad, g.N * g.C, g.H, g.W, ph, pw, sh, sw, slack(g.kw, g.dw));
    run_plane(p);
}

void conv2d_implicit_backward_data(py::object gyo, py::object wo, py::object gxo, py::object wso, index_t sh,
                                   index_t sw, index_t ph, index_t pw, index_t dh, index_t dw, index_t groups) {
    auto [gy, w, gx, ws] = checked_arrays(gyo, "gy", wo, "w", gxo, "gx", wso);
    require(sh == 1 && sw == 1, "the implicit backward-data runs stride 1 only");
    const ConvGeom g = implicit_geom(gx, w, gy, 1, 1, ph, pw, dh, dw, groups, "gx", "gy");
    const index_t qh = dh * (g.kh - 1) - ph, qw = dw * (g.kw - 1) - pw;   // gy's padding
    require(qh >= 0 && qw >= 0, "the implicit backward-data needs padding <= dilation * (kernel - 1)");
    check_pass(g, 1, ws, gx, "gx", {{&gy, "gy"}, {&w, "w"}});
    // gx[c] = sum over o, taps t of w[o, c, K-1-t] * gy_padded[o, q + off[t]]
    const Phases f(g.OH, g.OW, 1, 1, qh, qw);
    float* pad = ws.mutable_data();
    Plane p{g.N, g.G, g.Og, g.Cg, f.cs, f.Wq, g.H, g.W, g.K(), plane_offsets(g, f), w.data(), g.K() - 1,
            g.Og * g.Cg * g.K(), g.K(), g.Cg * g.K(), -1, pad, pad + (ws.size() - w.size()),
            pad + g.N * g.O * f.cs + slack(g.kw, g.dw), nullptr, gx.mutable_data(), 0, {}, {}};
    const float* gys = gy.data();
    py::gil_scoped_release nogil;
    pad_phases(gys, pad, g.N * g.O, g.OH, g.OW, qh, qw, 1, 1, slack(g.kw, g.dw));
    run_plane(p);
}

void conv2d_implicit_backward_filter(py::object xo, py::object gyo, py::object gwo, py::object wso, index_t sh,
                                     index_t sw, index_t ph, index_t pw, index_t dh, index_t dw, index_t groups) {
    auto [x, gy, gw, ws] = checked_arrays(xo, "x", gyo, "gy", gwo, "gw", wso);
    const ConvGeom g = implicit_geom(x, gw, gy, sh, sw, ph, pw, dh, dw, groups, "x", "gy");
    check_pass(g, 2, ws, gw, "gw", {{&x, "x"}, {&gy, "gy"}});
    Rows p{g.N, g.G, g.Cg, g.Og, (g.Cg + kL - 1) / kL, g.O, g.H + 2 * ph, g.W + 2 * pw, g.OH, g.OW, g.K(), sh, sw,
           {}, ws.data(), gy.data(), gw.mutable_data()};
    for (index_t i = 0; i < g.kh; ++i)
        for (index_t j = 0; j < g.kw; ++j) p.off.push_back((i * dh * p.Wp + j * dw) * kL);
    const float* xs = x.data();
    float* blocks = ws.mutable_data();
    py::gil_scoped_release nogil;
    pad_blocks(xs, blocks, p, g.H, g.W, ph, pw);
    run_rows(p);
}

}  // namespace minidnn
