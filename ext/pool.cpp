// 2-D max and average pooling (NCHW), PyTorch semantics with ceil_mode=False.
//
// Max pooling pads with -inf, the first maximum in row-major window order wins
// (a later element replaces it only if strictly greater, or if it is NaN, as
// in PyTorch's CPU kernel).  The backward pass recomputes the argmax from x:
// no index buffer is kept.  All kernels are parallel over (n, c) planes, each
// plane handled by one thread in a fixed order => deterministic.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels.h"

namespace minidnn {
namespace {

// Range [lo, hi) of taps t (0 <= t < K) with start + t*d in [0, in).
inline void tap_range(index_t K, index_t in, index_t d, index_t start,
                      index_t* lo, index_t* hi) {
    index_t l = start >= 0 ? 0 : (-start + d - 1) / d;
    index_t h = (in - 1 - start) < 0 ? 0 : (in - 1 - start) / d + 1;
    l = std::min(l, K);
    h = std::min(std::max(h, l), K);
    *lo = l;
    *hi = h;
}

struct PoolGeom {
    index_t N, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW;
};

PoolGeom pool_geom(const py::array& x, const char* xname, index_t kh, index_t kw,
                   index_t sh, index_t sw, index_t ph, index_t pw, index_t dh,
                   index_t dw) {
    if (x.ndim() != 4)
        throw py::value_error(std::string("argument '") + xname +
                              "' must be 4-D (N, C, H, W), got shape " + shape_str(x));
    PoolGeom g{x.shape(0), x.shape(1), x.shape(2), x.shape(3), kh, kw, sh, sw,
               ph,         pw,         dh,         dw,         0,  0};
    window_out_size(g.H, g.W, kh, kw, sh, sw, ph, pw, dh, dw, &g.OH, &g.OW);
    require(2 * ph <= kh && 2 * pw <= kw,
            "pooling padding must be at most half of the kernel size, got padding " +
                std::to_string(ph) + "x" + std::to_string(pw) + " for kernel " +
                std::to_string(kh) + "x" + std::to_string(kw));
    require(g.H * g.W < (index_t(1) << 31),
            "pooling planes must hold fewer than 2**31 elements");
    return g;
}

// Per-call precomputed tap ranges (avoids integer divisions in the loops):
//   ilo/ihi[oh]: valid window rows i of output row oh,
//   owlo/owhi[j]: output columns ow for which tap column j is inside the image,
//   first[ow]: input column of the first valid tap of window column ow (-1: none).
struct Taps {
    std::vector<index_t> ilo, ihi, owlo, owhi, first;
    explicit Taps(const PoolGeom& g)
        : ilo(g.OH), ihi(g.OH), owlo(g.kw), owhi(g.kw), first(g.OW) {
        for (index_t oh = 0; oh < g.OH; ++oh)
            tap_range(g.kh, g.H, g.dh, oh * g.sh - g.ph, &ilo[oh], &ihi[oh]);
        for (index_t j = 0; j < g.kw; ++j)  // ow*sw + (j*dw - pw) in [0, W)
            tap_range(g.OW, g.W, g.sw, j * g.dw - g.pw, &owlo[j], &owhi[j]);
        for (index_t ow = 0; ow < g.OW; ++ow) {
            index_t lo, hi;
            const index_t ws = ow * g.sw - g.pw;
            tap_range(g.kw, g.W, g.dw, ws, &lo, &hi);
            first[ow] = lo < hi ? ws + lo * g.dw : -1;
        }
    }
};

// Index type of argmax buffers: same width as T so that the selects vectorise.
template <typename T>
using idx_of = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;

// Max (and, if WithIdx, its index within the plane) of the windows of output
// row oh of one plane, written to m[0:OW] (and best[0:OW]).  Taps are visited
// in row-major window order (i, j); a tap replaces the running max only if it
// is strictly greater or NaN (PyTorch's rule).  The loop runs over the output
// columns for each tap, so it is branch-free and vectorises.  Windows holding
// no input pixel give -inf and index -1; otherwise the index starts at the
// first valid tap (so an all -inf window routes its gradient there, as
// PyTorch does).
template <bool WithIdx, typename T>
inline void row_max(const T* __restrict plane, const PoolGeom& g, const Taps& tp,
                    index_t oh, T* __restrict m, idx_of<T>* __restrict best) {
    using I = idx_of<T>;
    const index_t OW = g.OW, W = g.W, sw = g.sw, kw = g.kw;
    const index_t hs = oh * g.sh - g.ph;
    const index_t ilo = tp.ilo[oh], ihi = tp.ihi[oh];
    for (index_t ow = 0; ow < OW; ++ow) m[ow] = -std::numeric_limits<T>::infinity();
    if (WithIdx) {
        const index_t* __restrict first = tp.first.data();
        if (ilo < ihi) {
            const index_t rb = (hs + ilo * g.dh) * W;
            for (index_t ow = 0; ow < OW; ++ow)
                best[ow] = first[ow] >= 0 ? static_cast<I>(rb + first[ow]) : I(-1);
        } else {
            for (index_t ow = 0; ow < OW; ++ow) best[ow] = I(-1);
        }
    }
    for (index_t i = ilo; i < ihi; ++i) {
        const index_t ih = hs + i * g.dh;
        const T* row = plane + ih * W;
        for (index_t j = 0; j < kw; ++j) {
            const index_t lo = tp.owlo[j], hi = tp.owhi[j];
            if (lo >= hi) continue;
            const index_t woff = j * g.dw - g.pw;  // iw = ow*sw + woff
            const T* src = row + lo * sw + woff;
            T* mm = m + lo;
            const index_t cnt = hi - lo;
            if (WithIdx) {
                I* bb = best + lo;
                const I base = static_cast<I>(ih * W + lo * sw + woff);
                const I isw = static_cast<I>(sw);
                for (index_t k = 0; k < cnt; ++k) {
                    const T v = src[k * sw];
                    const T cur = mm[k];
                    const bool upd = (v > cur) | (v != v);
                    mm[k] = upd ? v : cur;
                    bb[k] = upd ? base + static_cast<I>(k) * isw : bb[k];
                }
            } else if (sw == 1) {
                for (index_t k = 0; k < cnt; ++k) {
                    const T v = src[k];
                    const T cur = mm[k];
                    mm[k] = ((v > cur) | (v != v)) ? v : cur;
                }
            } else {
                for (index_t k = 0; k < cnt; ++k) {
                    const T v = src[k * sw];
                    const T cur = mm[k];
                    mm[k] = ((v > cur) | (v != v)) ? v : cur;
                }
            }
        }
    }
}

template <typename T>
void maxpool_fwd_t(py::handle xo, py::handle yo, index_t kh, index_t kw, index_t sh,
                   index_t sw, index_t ph, index_t pw, index_t dh, index_t dw) {
    auto x = checked<T>(xo, "x", false);
    auto y = checked<T>(yo, "y", true);
    const PoolGeom g = pool_geom(x, "x", kh, kw, sh, sw, ph, pw, dh, dw);
    check_shape(y, "y", {g.N, g.C, g.OH, g.OW});
    check_no_overlap(x, "x", y, "y");
    const T* xp = x.data();
    T* yp = y.mutable_data();
    py::gil_scoped_release nogil;
    const Taps tp(g);
    const index_t NC = g.N * g.C, HW = g.H * g.W, L = g.OH * g.OW;
    MINIDNN_OMP_FOR(NC * L * kh * kw >= kParallelGrain && NC > 1)
    for (index_t nc = 0; nc < NC; ++nc) {
        const T* plane = xp + nc * HW;
        for (index_t oh = 0; oh < g.OH; ++oh)
            row_max<false, T>(plane, g, tp, oh, yp + nc * L + oh * g.OW, nullptr);
    }
}

template <typename T>
void maxpool_bwd_t(py::handle xo, py::handle gyo, py::handle gxo, index_t kh,
                   index_t kw, index_t sh, index_t sw, index_t ph, index_t pw,
                   index_t dh, index_t dw) {
    auto x = checked<T>(xo, "x", false);
    auto gy = checked<T>(gyo, "gy", false);
    auto gx = checked<T>(gxo, "gx", true);
    const PoolGeom g = pool_geom(x, "x", kh, kw, sh, sw, ph, pw, dh, dw);
    check_shape(gy, "gy", {g.N, g.C, g.OH, g.OW});
    check_shape(gx, "gx", {g.N, g.C, g.H, g.W});
    check_no_overlap(x, "x", gx, "gx");
    check_no_overlap(gy, "gy", gx, "gx");
    const T* xp = x.data();
    const T* gyp = gy.data();
    T* gxp = gx.mutable_data();
    py::gil_scoped_release nogil;
    const Taps tp(g);
    const index_t NC = g.N * g.C, HW = g.H * g.W, L = g.OH * g.OW;
    MINIDNN_OMP_FOR(NC * (L * kh * kw + HW) >= kParallelGrain && NC > 1)
    for (index_t nc = 0; nc < NC; ++nc) {
        const T* gout = gyp + nc * L;
        T* gin = gxp + nc * HW;
        std::fill(gin, gin + HW, T(0));
        std::vector<T> m(static_cast<size_t>(g.OW));
        std::vector<idx_of<T>> best(static_cast<size_t>(g.OW));
        for (index_t oh = 0; oh < g.OH; ++oh) {
            row_max<true, T>(xp + nc * HW, g, tp, oh, m.data(), best.data());
            const T* go = gout + oh * g.OW;
            for (index_t ow = 0; ow < g.OW; ++ow)
                if (best[ow] >= 0) gin[best[ow]] += go[ow];
        }
    }
}

// PyTorch AvgPool2d window bounds and divisor for output (oh, ow).
struct AvgWin {
    index_t h0, h1, w0, w1, div;
};

inline AvgWin avg_window(const PoolGeom& g, index_t oh, index_t ow, bool include_pad) {
    index_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
    index_t h1 = std::min(h0 + g.kh, g.H + g.ph);
    index_t w1 = std::min(w0 + g.kw, g.W + g.pw);
    const index_t pool = (h1 - h0) * (w1 - w0);
    h0 = std::max<index_t>(h0, 0);
    w0 = std::max<index_t>(w0, 0);
    h1 = std::min(h1, g.H);
    w1 = std::min(w1, g.W);
    const index_t div = include_pad ? pool : (h1 - h0) * (w1 - w0);
    return {h0, h1, w0, w1, div};
}

template <typename T>
void avgpool_fwd_t(py::handle xo, py::handle yo, index_t kh, index_t kw, index_t sh,
                   index_t sw, index_t ph, index_t pw, bool include_pad) {
    auto x = checked<T>(xo, "x", false);
    auto y = checked<T>(yo, "y", true);
    const PoolGeom g = pool_geom(x, "x", kh, kw, sh, sw, ph, pw, 1, 1);
    check_shape(y, "y", {g.N, g.C, g.OH, g.OW});
    check_no_overlap(x, "x", y, "y");
    const T* xp = x.data();
    T* yp = y.mutable_data();
    py::gil_scoped_release nogil;
    const index_t NC = g.N * g.C, HW = g.H * g.W, L = g.OH * g.OW;
    MINIDNN_OMP_FOR(NC * L * kh * kw >= kParallelGrain && NC > 1)
    for (index_t nc = 0; nc < NC; ++nc) {
        const T* plane = xp + nc * HW;
        T* out = yp + nc * L;
        for (index_t oh = 0; oh < g.OH; ++oh)
            for (index_t ow = 0; ow < g.OW; ++ow) {
                const AvgWin w = avg_window(g, oh, ow, include_pad);
                T s = T(0);
                for (index_t ih = w.h0; ih < w.h1; ++ih)
                    for (index_t iw = w.w0; iw < w.w1; ++iw) s += plane[ih * g.W + iw];
                out[oh * g.OW + ow] = s / static_cast<T>(w.div);
            }
    }
}

template <typename T>
void avgpool_bwd_t(py::handle gyo, py::handle gxo, index_t kh, index_t kw, index_t sh,
                   index_t sw, index_t ph, index_t pw, bool include_pad) {
    auto gy = checked<T>(gyo, "gy", false);
    auto gx = checked<T>(gxo, "gx", true);
    const PoolGeom g = pool_geom(gx, "gx", kh, kw, sh, sw, ph, pw, 1, 1);
    check_shape(gy, "gy", {g.N, g.C, g.OH, g.OW});
    check_no_overlap(gy, "gy", gx, "gx");
    const T* gyp = gy.data();
    T* gxp = gx.mutable_data();
    py::gil_scoped_release nogil;
    const index_t NC = g.N * g.C, HW = g.H * g.W, L = g.OH * g.OW;
    MINIDNN_OMP_FOR(NC * (L * kh * kw + HW) >= kParallelGrain && NC > 1)
    for (index_t nc = 0; nc < NC; ++nc) {
        const T* gout = gyp + nc * L;
        T* gin = gxp + nc * HW;
        std::fill(gin, gin + HW, T(0));
        for (index_t oh = 0; oh < g.OH; ++oh)
            for (index_t ow = 0; ow < g.OW; ++ow) {
                const AvgWin w = avg_window(g, oh, ow, include_pad);
                const T d = gout[oh * g.OW + ow] / static_cast<T>(w.div);
                for (index_t ih = w.h0; ih < w.h1; ++ih)
                    for (index_t iw = w.w0; iw < w.w1; ++iw) gin[ih * g.W + iw] += d;
            }
    }
}

}  // namespace

void maxpool2d_forward(py::object x, py::object y, index_t kh, index_t kw,
                       index_t sh, index_t sw, index_t ph, index_t pw,
                       index_t dh, index_t dw) {
    const DType dt = float_dtype(as_ndarray(x, "x"), "x");
    dispatch(dt, [&](auto t) {
        maxpool_fwd_t<decltype(t)>(x, y, kh, kw, sh, sw, ph, pw, dh, dw);
    });
}

void maxpool2d_backward(py::object x, py::object gy, py::object gx, index_t kh,
                        index_t kw, index_t sh, index_t sw, index_t ph,
                        index_t pw, index_t dh, index_t dw) {
    const DType dt = float_dtype(as_ndarray(x, "x"), "x");
    dispatch(dt, [&](auto t) {
        maxpool_bwd_t<decltype(t)>(x, gy, gx, kh, kw, sh, sw, ph, pw, dh, dw);
    });
}

void avgpool2d_forward(py::object x, py::object y, index_t kh, index_t kw,
                       index_t sh, index_t sw, index_t ph, index_t pw,
                       bool count_include_pad) {
    const DType dt = float_dtype(as_ndarray(x, "x"), "x");
    dispatch(dt, [&](auto t) {
        avgpool_fwd_t<decltype(t)>(x, y, kh, kw, sh, sw, ph, pw, count_include_pad);
    });
}

void avgpool2d_backward(py::object gy, py::object gx, index_t kh, index_t kw,
                        index_t sh, index_t sw, index_t ph, index_t pw,
                        bool count_include_pad) {
    const DType dt = float_dtype(as_ndarray(gy, "gy"), "gy");
    dispatch(dt, [&](auto t) {
        avgpool_bwd_t<decltype(t)>(gy, gx, kh, kw, sh, sw, ph, pw, count_include_pad);
    });
}

}  // namespace minidnn
