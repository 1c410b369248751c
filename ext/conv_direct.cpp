// Direct ("implicit") convolution with no workspace at all, forward and
// backward-data (the filter gradient is in conv_direct_filter.cpp), for any
// stride, padding, dilation and groups.
//
// Each output row is computed in register blocks: B channels x R vectors of
// L lanes along the row, summed tap by tap over the group's channels with one
// broadcast weight per channel and one vector load per tap. Lanes whose input
// falls in the padding are zeroed by a mask; blocks away from the borders
// take plain loads, stride 2 takes two loads and a shuffle. Narrow planes
// (stride 1, rows that keep their width) run as one long row so that 7x7 and
// 4x4 planes fill every lane. Every output element is owned by one thread and
// summed in a fixed order: bitwise identical whatever the thread count, and
// with or without AVX2 (no FMA contraction, lanes independent).
//
// The backward-data pass gathers instead of scattering: for stride s the
// pixels iw = r + s*q of one residue r read gy at ow = q + e_j, contiguous in
// q, so it needs no atomics and no zero-fill pass.
#include "conv_direct.h"

namespace minidnn {
namespace {

// Forward on flat planes: item = ((n * nblk + pb) * G + gi) * nob + ob.
template <typename T, int OB, int R>
struct ForwardFlat {
    using S = Simd<T>;
    using V = typename S::V;
    static constexpr int RL = R * S::L;

    static MINIDNN_INLINE void item(const Args<T>& a, index_t it) {
        const ConvGeom& g = a.g;
        const index_t nob = (g.Og + OB - 1) / OB, OHW = g.OH * g.OW;
        const index_t nblk = (OHW + RL - 1) / RL;
        const index_t ob_i = it % nob;
        const index_t gi = (it / nob) % g.G;
        const index_t pb = (it / (nob * g.G)) % nblk;
        const index_t n = it / (nob * g.G * nblk);
        const index_t o0 = gi * g.Og + ob_i * OB;
        const int ob = static_cast<int>(std::min<index_t>(OB, (gi + 1) * g.Og - o0));
        const index_t K = g.K(), HW = g.H * g.W, p0 = pb * RL;
        const index_t lanes = std::min<index_t>(RL, OHW - p0);
        const T* xg = a.a + (n * g.C + gi * g.Cg) * HW + p0;
        const T* wo[OB];
        for (int o = 0; o < OB; ++o) wo[o] = a.b + (o0 + std::min(o, ob - 1)) * g.Cg * K;
        FlatLanes<T, R> fl;
        fl.init(p0, lanes, g.OW);
        V acc[OB][R];
        MINIDNN_UNROLL
        for (int o = 0; o < OB; ++o)
            MINIDNN_UNROLL
            for (int r = 0; r < R; ++r) acc[o][r] = V{};
        for (index_t i = 0; i < g.kh; ++i) {
            for (index_t j = 0; j < g.kw; ++j) {
                const index_t dr = i * g.dh - g.ph, dc = j * g.dw - g.pw;
                typename S::M m[R];
                const int valid = fl.mask(dr, dc, g.H, g.W, m);
                if (!valid) continue;
                const T* wp[OB];
                for (int o = 0; o < OB; ++o) wp[o] = wo[o] + i * g.kw + j;
                tap_flat<T, OB, R>(xg + dr * g.W + dc, HW, g.Cg, wp, K, m, valid, a.a, a.a_end, acc);
            }
        }
        for (int o = 0; o < std::min(ob, OB); ++o) {
            if (a.bias) {
                const T bv = a.bias[o0 + o];
                MINIDNN_UNROLL
                for (int r = 0; r < R; ++r) acc[o][r] += bv;
            }
            store_lanes<T, R>(a.out + (n * g.O + o0 + o) * OHW + p0, acc[o], lanes);
        }
    }
};

// Backward-data on flat planes (gx[p] reads gy[p + dr*W + dc]):
// item = ((n * nblk + pb) * G + gi) * ncb + cb.
template <typename T, int CB, int R>
struct BackwardDataFlat {
    using S = Simd<T>;
    using V = typename S::V;
    static constexpr int RL = R * S::L;

    static MINIDNN_INLINE void item(const Args<T>& a, index_t it) {
        const ConvGeom& g = a.g;
        const index_t ncb = (g.Cg + CB - 1) / CB, HW = g.H * g.W, OHW = g.OH * g.OW;
        const index_t nblk = (HW + RL - 1) / RL;
        const index_t cb_i = it % ncb;
        const index_t gi = (it / ncb) % g.G;
        const index_t pb = (it / (ncb * g.G)) % nblk;
        const index_t n = it / (ncb * g.G * nblk);
        const index_t cc0 = cb_i * CB;
        const int cb = static_cast<int>(std::min<index_t>(CB, g.Cg - cc0));
        const index_t K = g.K(), p0 = pb * RL;
        const index_t lanes = std::min<index_t>(RL, HW - p0);
        const T* gyg = a.a + (n * g.O + gi * g.Og) * OHW + p0;
        const T* wc[CB];
        for (int c = 0; c < CB; ++c)
            wc[c] = a.b + gi * g.Og * g.Cg * K + (cc0 + std::min(c, cb - 1)) * K;
        FlatLanes<T, R> fl;
        fl.init(p0, lanes, g.W);
        V acc[CB][R];
        MINIDNN_UNROLL
        for (int c = 0; c < CB; ++c)
            MINIDNN_UNROLL
            for (int r = 0; r < R; ++r) acc[c][r] = V{};
        for (index_t i = 0; i < g.kh; ++i) {
            for (index_t j = 0; j < g.kw; ++j) {
                const index_t dr = g.ph - i * g.dh, dc = g.pw - j * g.dw;
                typename S::M m[R];
                const int valid = fl.mask(dr, dc, g.OH, g.OW, m);
                if (!valid) continue;
                const T* wp[CB];
                for (int c = 0; c < CB; ++c) wp[c] = wc[c] + i * g.kw + j;
                tap_flat<T, CB, R>(gyg + dr * g.OW + dc, OHW, g.Og, wp, g.Cg * K, m, valid, a.a, a.a_end,
                                   acc);
            }
        }
        for (int c = 0; c < std::min(cb, CB); ++c)
            store_lanes<T, R>(a.out + (n * g.C + gi * g.Cg + cc0 + c) * HW + p0, acc[c], lanes);
    }
};

// ------------------------------------------------------------------ forward
// item = ((n * OH + oh) * G + gi) * nob + ob: OB output channels of one row,
// in blocks of R vectors, each summed tap by tap over the group's channels.
template <typename T, int OB, int R>
struct Forward {
    using S = Simd<T>;
    using V = typename S::V;
    static constexpr int RL = R * S::L;

    static MINIDNN_INLINE void item(const Args<T>& a, index_t it) {
        const ConvGeom& g = a.g;
        const index_t nob = (g.Og + OB - 1) / OB;
        const index_t ob_i = it % nob;
        const index_t gi = (it / nob) % g.G;
        const index_t oh = (it / (nob * g.G)) % g.OH;
        const index_t n = it / (nob * g.G * g.OH);
        const index_t o0 = gi * g.Og + ob_i * OB;
        const int ob = static_cast<int>(std::min<index_t>(OB, (gi + 1) * g.Og - o0));
        const index_t K = g.K(), HW = g.H * g.W;
        const T* xg = a.a + (n * g.C + gi * g.Cg) * HW;
        const T* wo[OB];
        MINIDNN_UNROLL
        for (int o = 0; o < OB; ++o) wo[o] = a.b + (o0 + std::min(o, ob - 1)) * g.Cg * K;
        index_t i_lo = 0, i_hi = 0;  // taps i whose input row is inside the image
        lane_range(oh * g.sh - g.ph, g.dh, g.H, g.kh, &i_lo, &i_hi);
        for (index_t ow0 = 0; ow0 < g.OW; ow0 += RL) {
            const index_t lanes = std::min<index_t>(RL, g.OW - ow0);
            V acc[OB][R];
            MINIDNN_UNROLL
            for (int o = 0; o < OB; ++o)
                MINIDNN_UNROLL
                for (int r = 0; r < R; ++r) acc[o][r] = V{};
            for (index_t i = i_lo; i < i_hi; ++i) {
                const T* xr = xg + (oh * g.sh - g.ph + i * g.dh) * g.W;
                for (index_t j = 0; j < g.kw; ++j) {
                    const index_t base = ow0 * g.sw - g.pw + j * g.dw;
                    index_t l0, l1;
                    lane_range(base, g.sw, g.W, lanes, &l0, &l1);
                    if (l0 >= l1) continue;
                    const T* wp[OB];
                    MINIDNN_UNROLL
                    for (int o = 0; o < OB; ++o) wp[o] = wo[o] + i * g.kw + j;
                    tap<T, OB, R>(xr + base, HW, g.sw, g.Cg, wp, K, l0, l1, a.a, a.a_end, acc);
                }
            }
            for (int o = 0; o < std::min(ob, OB); ++o) {
                if (a.bias) {
                    const T bv = a.bias[o0 + o];
                    MINIDNN_UNROLL
                    for (int r = 0; r < R; ++r) acc[o][r] += bv;
                }
                T* yr = a.out + ((n * g.O + o0 + o) * g.OH + oh) * g.OW + ow0;
                std::memcpy(yr, acc[o], static_cast<size_t>(lanes) * sizeof(T));
            }
        }
    }
};

// ------------------------------------------------------------ backward-data
// item = ((n * H + ih) * G + gi) * ncb + cb: CB input channels of one row of gx.
// Columns iw = res + sw*q of one residue res read gy at ow = q + e_j, for the
// taps j with sw | res + pw - j*dw: contiguous in q, a gather with no scatter.
template <typename T, int CB, int R>
struct BackwardData {
    using S = Simd<T>;
    using V = typename S::V;
    static constexpr int RL = R * S::L;

    static MINIDNN_INLINE void item(const Args<T>& a, index_t it) {
        const ConvGeom& g = a.g;
        const index_t ncb = (g.Cg + CB - 1) / CB;
        const index_t cb_i = it % ncb;
        const index_t gi = (it / ncb) % g.G;
        const index_t ih = (it / (ncb * g.G)) % g.H;
        const index_t n = it / (ncb * g.G * g.H);
        const index_t cc0 = cb_i * CB;  // first channel within the group
        const int cb = static_cast<int>(std::min<index_t>(CB, g.Cg - cc0));
        const index_t K = g.K(), OHW = g.OH * g.OW;
        const T* gyg = a.a + (n * g.O + gi * g.Og) * OHW;
        const T* wc[CB];
        MINIDNN_UNROLL
        for (int c = 0; c < CB; ++c)
            wc[c] = a.b + gi * g.Og * g.Cg * K + (cc0 + std::min(c, cb - 1)) * K;
        index_t taps_i[kMaxKw], taps_oh[kMaxKw];  // taps i that land on an output row
        int ntaps = 0;
        for (index_t i = 0; i < g.kh; ++i) {
            const index_t num = ih + g.ph - i * g.dh;
            if (num < 0 || num % g.sh || num / g.sh >= g.OH) continue;
            taps_i[ntaps] = i;
            taps_oh[ntaps++] = num / g.sh;
        }
        for (index_t res = 0; res < std::min(g.sw, g.W); ++res) {
            index_t js[kMaxKw], e[kMaxKw];
            int nj = 0;
            for (index_t j = 0; j < g.kw; ++j) {
                const index_t num = res + g.pw - j * g.dw;
                const index_t m = ((num % g.sw) + g.sw) % g.sw;
                if (m) continue;
                js[nj] = j;
                e[nj++] = (num - m) / g.sw;
            }
            const index_t Q = (g.W - res + g.sw - 1) / g.sw;
            for (index_t q0 = 0; q0 < Q; q0 += RL) {
                const index_t lanes = std::min<index_t>(RL, Q - q0);
                V acc[CB][R];
                MINIDNN_UNROLL
                for (int c = 0; c < CB; ++c)
                    MINIDNN_UNROLL
                    for (int r = 0; r < R; ++r) acc[c][r] = V{};
                for (int t = 0; t < ntaps; ++t) {
                    const T* gr = gyg + taps_oh[t] * g.OW;
                    for (int q = 0; q < nj; ++q) {
                        const index_t base = q0 + e[q];
                        index_t l0, l1;
                        lane_range(base, 1, g.OW, lanes, &l0, &l1);
                        if (l0 >= l1) continue;
                        const T* wp[CB];
                        MINIDNN_UNROLL
                        for (int c = 0; c < CB; ++c) wp[c] = wc[c] + taps_i[t] * g.kw + js[q];
                        tap<T, CB, R>(gr + base, OHW, 1, g.Og, wp, g.Cg * K, l0, l1, a.a, a.a_end, acc);
                    }
                }
                for (int c = 0; c < cb; ++c) {
                    T* xr = a.out + ((n * g.C + gi * g.Cg + cc0 + c) * g.H + ih) * g.W + res;
                    if (g.sw == 1) {
                        std::memcpy(xr + q0, acc[c], static_cast<size_t>(lanes) * sizeof(T));
                    } else {
                        T t[RL];
                        std::memcpy(t, acc[c], sizeof t);
                        for (index_t l = 0; l < lanes; ++l) xr[(q0 + l) * g.sw] = t[l];
                    }
                }
            }
        }
    }
};

template <typename T>
void forward_t(py::handle xo, py::handle wo, py::handle bo, py::handle yo, index_t sh, index_t sw,
               index_t ph, index_t pw, index_t dh, index_t dw, index_t groups) {
    auto x = checked<T>(xo, "x", false);
    auto w = checked<T>(wo, "w", false);
    auto y = checked<T>(yo, "y", true);
    const ConvGeom g = conv_geom(x, w, y, sh, sw, ph, pw, dh, dw, groups, "x", "y");
    const T* bp = checked_bias<T>(bo, g.O, y);
    check_no_overlap(x, "x", y, "y");
    check_no_overlap(w, "w", y, "y");
    const bool flat = use_flat(g);
    Args<T> a{g, x.data(), x.data() + x.size(), w.data(), bp, y.mutable_data(), flat};
    int B = 1, RL = 1;
    RangeFn<T> fn = flat ? pick_blocking<T, ForwardFlat>(g.OH * g.OW, g.Og, &B, &RL)
                         : pick_blocking<T, Forward>(g.OW, g.Og, &B, &RL);
    const index_t rows = flat ? (g.OH * g.OW + RL - 1) / RL : g.OH;
    const index_t items = g.N * rows * g.G * ((g.Og + B - 1) / B);
    const double work = double(B) * (flat ? RL : g.OW) * g.Cg * g.K();
    py::gil_scoped_release nogil;
    run_items<T>(fn, a, items, work);
}

template <typename T>
void backward_data_t(py::handle gyo, py::handle wo, py::handle gxo, index_t sh, index_t sw,
                     index_t ph, index_t pw, index_t dh, index_t dw, index_t groups) {
    auto gy = checked<T>(gyo, "gy", false);
    auto w = checked<T>(wo, "w", false);
    auto gx = checked<T>(gxo, "gx", true);
    const ConvGeom g = conv_geom(gx, w, gy, sh, sw, ph, pw, dh, dw, groups, "gx", "gy");
    check_no_overlap(gy, "gy", gx, "gx");
    check_no_overlap(w, "w", gx, "gx");
    const bool flat = use_flat(g);
    Args<T> a{g, gy.data(), gy.data() + gy.size(), w.data(), nullptr, gx.mutable_data(), flat};
    int B = 1, RL = 1;
    RangeFn<T> fn = flat ? pick_blocking<T, BackwardDataFlat>(g.H * g.W, g.Cg, &B, &RL)
                         : pick_blocking<T, BackwardData>((g.W + g.sw - 1) / g.sw, g.Cg, &B, &RL);
    const index_t rows = flat ? (g.H * g.W + RL - 1) / RL : g.H;
    const index_t items = g.N * rows * g.G * ((g.Cg + B - 1) / B);
    const double work = double(B) * (flat ? RL : g.W) * g.Og * g.K() / double(g.sh * g.sw);
    py::gil_scoped_release nogil;
    run_items<T>(fn, a, items, work);
}

template <typename T>
void add_bias_t(py::handle yo, py::handle bo) {
    auto y = checked<T>(yo, "y", true);
    auto b = checked<T>(bo, "b", false);
    require(y.ndim() >= 2, "argument 'y' must be at least 2-D (N, C, ...), got shape " + shape_str(y));
    const index_t N = y.shape(0), C = y.shape(1), L = trailing_size(y, 2);
    check_shape(b, "b", {C});
    check_no_overlap(y, "y", b, "b");
    T* yp = y.mutable_data();
    const T* bp = b.data();
    py::gil_scoped_release nogil;
    const index_t NC = N * C;
    MINIDNN_OMP_FOR(NC * L >= 4 * kParallelGrain && NC > 1)
    for (index_t nc = 0; nc < NC; ++nc) {
        const T v = bp[nc % C];
        T* __restrict p = yp + nc * L;
        for (index_t l = 0; l < L; ++l) p[l] += v;
    }
}

}  // namespace

void conv2d_direct_forward(py::object x, py::object w, py::object b, py::object y, index_t sh,
                           index_t sw, index_t ph, index_t pw, index_t dh, index_t dw,
                           index_t groups) {
    const DType dt = float_dtype(as_ndarray(x, "x"), "x");
    dispatch(dt, [&](auto t) { forward_t<decltype(t)>(x, w, b, y, sh, sw, ph, pw, dh, dw, groups); });
}

void conv2d_direct_backward_data(py::object gy, py::object w, py::object gx, index_t sh,
                                 index_t sw, index_t ph, index_t pw, index_t dh, index_t dw,
                                 index_t groups) {
    const DType dt = float_dtype(as_ndarray(gy, "gy"), "gy");
    dispatch(dt, [&](auto t) {
        backward_data_t<decltype(t)>(gy, w, gx, sh, sw, ph, pw, dh, dw, groups);
    });
}

void conv2d_add_bias(py::object y, py::object b) {
    const DType dt = float_dtype(as_ndarray(y, "y"), "y");
    dispatch(dt, [&](auto t) { add_bias_t<decltype(t)>(y, b); });
}

}  // namespace minidnn
