// Direct convolution, filter gradient and bias gradient, with no workspace.
//
// gw[o, c, i, j] = sum over (n, oh, ow) of gy[n, o, oh, ow] * x[n, c, ih, iw]:
// for each (block of output channels, input channel) one thread keeps
// channels x taps lane accumulators in registers and streams over the
// samples and rows; the lanes are added in a fixed order at the end, so the
// result does not depend on the number of threads.
#include "conv_direct.h"

namespace minidnn {
namespace {

// ---------------------------------------------------------- backward-filter
// item = (gi * nob + ob) * Cg + cc: gw[o0:o0+OB, cc, :, :]. Taps are taken TJ
// columns j at a time, with OB x TJ lane accumulators in registers: for each
// vector of L outputs (n, oh, ow..ow+L) the OB gradients are loaded once and
// multiplied by the TJ shifted input vectors. Lanes are added in order at the end.
template <typename T, int OB, int TJ>
struct FilterTaps {
    using S = Simd<T>;
    using V = typename S::V;
    static constexpr int L = S::L;

    // One vector of lanes at gradient offset go and input row xr: mode 0 all
    // lanes valid, 1 some (masks precomputed for the block).
    template <int MODE>
    static MINIDNN_INLINE void step(const Args<T>& a, const T* const* gyn0, index_t go, const T* xr,
                                    const index_t* xoff, const index_t* l0, const index_t* l1,
                                    const typename S::M& tail, const typename S::M* xm,
                                    const T* gy_end, V (&acc)[OB][TJ]) {
        const ConvGeom& g = a.g;
        V gv[OB];
        MINIDNN_UNROLL
        for (int o = 0; o < OB; ++o) {
            const T* gp = gyn0[o] + go;
            if (MODE == 0)
                load_lanes<T, 1, 0>(gp, 1, 0, L, nullptr, &gv[o]);
            else if (readable(gp, gp + L, a.b, gy_end))
                load_lanes<T, 1, 2>(gp, 1, 0, L, &tail, &gv[o]);
            else
                load_lanes<T, 1, 3>(gp, 1, l0[TJ], l1[TJ], nullptr, &gv[o]);
        }
        MINIDNN_UNROLL
        for (int t = 0; t < TJ; ++t) {
            const T* xp = xr + xoff[t];
            V xv;
            if (MODE == 0) {
                if (g.sw == 1)
                    load_lanes<T, 1, 0>(xp, 1, 0, L, nullptr, &xv);
                else if (g.sw == 2 && readable(xp, xp + 2 * L, a.a, a.a_end))
                    load_lanes<T, 1, 4>(xp, 2, 0, L, nullptr, &xv);
                else
                    load_lanes<T, 1, 1>(xp, g.sw, 0, L, nullptr, &xv);
            } else if (g.sw == 1 && readable(xp, xp + L, a.a, a.a_end)) {
                load_lanes<T, 1, 2>(xp, 1, l0[t], l1[t], &xm[t], &xv);
            } else if (g.sw == 2 && readable(xp, xp + 2 * L, a.a, a.a_end)) {
                load_lanes<T, 1, 5>(xp, 2, l0[t], l1[t], &xm[t], &xv);
            } else {
                load_lanes<T, 1, 3>(xp, g.sw, l0[t], l1[t], nullptr, &xv);
            }
            MINIDNN_UNROLL
            for (int o = 0; o < OB; ++o) acc[o][t] += gv[o] * xv;
        }
    }

    // Flat planes (stride 1, OW == W): vectors of L outputs run across rows.
    static MINIDNN_INLINE void run_flat(const Args<T>& a, const T* const* gyn0, index_t c, index_t i,
                                        index_t j0, V (&acc)[OB][TJ]) {
        const ConvGeom& g = a.g;
        const index_t OHW = g.OH * g.OW, HW = g.H * g.W;
        const T* gy_end = a.b + g.N * g.O * OHW;
        const index_t K = g.K();
        for (index_t b = 0, p0 = 0; p0 < OHW; ++b, p0 += L) {
            const index_t lanes = std::min<index_t>(L, OHW - p0);
            // the masks of this block, computed once per call (see backward_filter_t)
            const typename S::M* xm = a.masks + b * K + i * g.kw + j0;
            const signed char* valid = a.valid + b * K + i * g.kw + j0;
            const typename S::M tail = a.tails[b];
            index_t xoff[TJ];
            bool any = false, full = lanes == L;
            MINIDNN_UNROLL
            for (int t = 0; t < TJ; ++t) {
                xoff[t] = p0 + (i * g.dh - g.ph) * g.W + (j0 + t) * g.dw - g.pw;
                any = any || valid[t];
                full = full && valid[t] == 2;
            }
            if (!any) continue;
            for (index_t n = 0; n < g.N; ++n) {
                const T* xc = a.a + (n * g.C + c) * HW;
                const index_t go = n * g.O * OHW + p0;
                V gv[OB];
                MINIDNN_UNROLL
                for (int o = 0; o < OB; ++o) {
                    const T* gp = gyn0[o] + go;
                    if (full)
                        load_lanes<T, 1, 0>(gp, 1, 0, L, nullptr, &gv[o]);
                    else if (readable(gp, gp + L, a.b, gy_end))
                        load_lanes<T, 1, 2>(gp, 1, 0, L, &tail, &gv[o]);
                    else
                        load_lanes<T, 1, 6>(gp, 1, 0, L, &tail, &gv[o]);
                }
                MINIDNN_UNROLL
                for (int t = 0; t < TJ; ++t) {
                    if (!valid[t]) continue;
                    const T* xp = xc + xoff[t];
                    V xv;
                    if (valid[t] == 2)
                        load_lanes<T, 1, 0>(xp, 1, 0, L, nullptr, &xv);
                    else if (readable(xp, xp + L, a.a, a.a_end))
                        load_lanes<T, 1, 2>(xp, 1, 0, L, &xm[t], &xv);
                    else
                        load_lanes<T, 1, 6>(xp, 1, 0, L, &xm[t], &xv);
                    MINIDNN_UNROLL
                    for (int o = 0; o < OB; ++o) acc[o][t] += gv[o] * xv;
                }
            }
        }
    }

    // Block by block along the row, then over every (n, oh): the lane ranges
    // and masks of a block are the same in every row.
    static MINIDNN_INLINE void run(const Args<T>& a, const T* const* gyn0, index_t c, index_t i,
                                   index_t j0, V (&acc)[OB][TJ]) {
        const ConvGeom& g = a.g;
        const index_t OHW = g.OH * g.OW, HW = g.H * g.W;
        const T* gy_end = a.b + g.N * g.O * OHW;
        index_t oh_lo, oh_hi;  // rows whose tap i is inside the image
        lane_range(i * g.dh - g.ph, g.sh, g.H, g.OH, &oh_lo, &oh_hi);
        for (index_t ow0 = 0; ow0 < g.OW; ow0 += L) {
            const index_t lanes = std::min<index_t>(L, g.OW - ow0);
            index_t l0[TJ + 1], l1[TJ + 1], xoff[TJ];
            typename S::M xm[TJ], tail;
            bool full = lanes == L;
            for (int t = 0; t < TJ; ++t) {
                xoff[t] = ow0 * g.sw - g.pw + (j0 + t) * g.dw;
                lane_range(xoff[t], g.sw, g.W, lanes, &l0[t], &l1[t]);
                full = full && l0[t] == 0 && l1[t] == L;
                make_mask<T, 1>(l0[t], l1[t], &xm[t]);
            }
            l0[TJ] = 0, l1[TJ] = lanes;  // the gradient: zero past the row
            make_mask<T, 1>(0, lanes, &tail);
            for (index_t n = 0; n < g.N; ++n) {
                const T* xc = a.a + (n * g.C + c) * HW + (oh_lo * g.sh - g.ph + i * g.dh) * g.W;
                index_t go = n * g.O * OHW + oh_lo * g.OW + ow0;
                for (index_t oh = oh_lo; oh < oh_hi; ++oh, go += g.OW, xc += g.sh * g.W) {
                    if (full)
                        step<0>(a, gyn0, go, xc, xoff, l0, l1, tail, xm, gy_end, acc);
                    else
                        step<1>(a, gyn0, go, xc, xoff, l0, l1, tail, xm, gy_end, acc);
                }
            }
        }
    }
};

template <typename T, int OB, int TJ_unused = 0>
struct BackwardFilter {
    using S = Simd<T>;
    using V = typename S::V;

    template <int TJ>
    static MINIDNN_INLINE void taps(const Args<T>& a, const T* const* gyn0, index_t c, index_t i,
                                    index_t j0, int ob, T* gw) {
        V acc[OB][TJ];
        MINIDNN_UNROLL
        for (int o = 0; o < OB; ++o)
            MINIDNN_UNROLL
            for (int t = 0; t < TJ; ++t) acc[o][t] = V{};
        if (a.flat)
            FilterTaps<T, OB, TJ>::run_flat(a, gyn0, c, i, j0, acc);
        else
            FilterTaps<T, OB, TJ>::run(a, gyn0, c, i, j0, acc);
        const index_t K = a.g.K();
        for (int o = 0; o < std::min(ob, OB); ++o)
            MINIDNN_UNROLL
            for (int t = 0; t < TJ; ++t) {
                T lanes[S::L];
                std::memcpy(lanes, &acc[o][t], sizeof lanes);
                T s = lanes[0];
                for (int l = 1; l < S::L; ++l) s += lanes[l];
                gw[o * a.g.Cg * K + i * a.g.kw + j0 + t] = s;
            }
    }

    static MINIDNN_INLINE void item(const Args<T>& a, index_t it) {
        const ConvGeom& g = a.g;
        const index_t nob = (g.Og + OB - 1) / OB;
        const index_t cc = it % g.Cg;
        const index_t ob_i = (it / g.Cg) % nob;
        const index_t gi = it / (g.Cg * nob);
        const index_t o0 = gi * g.Og + ob_i * OB;
        const int ob = static_cast<int>(std::min<index_t>(OB, (gi + 1) * g.Og - o0));
        const T* gyn0[OB];  // gradient planes of sample 0
        MINIDNN_UNROLL
        for (int o = 0; o < OB; ++o) gyn0[o] = a.b + (o0 + std::min(o, ob - 1)) * g.OH * g.OW;
        T* gw = a.out + (o0 * g.Cg + cc) * g.K();
        const index_t c = gi * g.Cg + cc;
        for (index_t i = 0; i < g.kh; ++i) {
            index_t j = 0;
            for (; j + 3 <= g.kw; j += 3) taps<3>(a, gyn0, c, i, j, ob, gw);
            if (g.kw - j == 2) taps<2>(a, gyn0, c, i, j, ob, gw);
            if (g.kw - j == 1) taps<1>(a, gyn0, c, i, j, ob, gw);
        }
    }
};

template <typename T>
void backward_filter_t(py::handle xo, py::handle gyo, py::handle gwo, index_t sh, index_t sw,
                       index_t ph, index_t pw, index_t dh, index_t dw, index_t groups) {
    auto x = checked<T>(xo, "x", false);
    auto gy = checked<T>(gyo, "gy", false);
    auto gw = checked<T>(gwo, "gw", true);
    const ConvGeom g = conv_geom(x, gw, gy, sh, sw, ph, pw, dh, dw, groups, "x", "gy");
    check_no_overlap(x, "x", gw, "gw");
    check_no_overlap(gy, "gy", gw, "gw");
    // flat planes here only when rows are shorter than a vector: the masks of a
    // block serve N rows only, not N * C as in the other passes
    using S = Simd<T>;
    // flat planes pay off here for narrow rows only (measured: 7 and 14 wide
    // gain 2-3x, 28 and 32 wide lose to rows)
    const bool flat = use_flat(g) && g.OW <= 16;
    Args<T> a{g, x.data(), x.data() + x.size(), gy.data(), nullptr, gw.mutable_data(), flat};
    // flat planes: the lane masks of every (block, tap) are the same for every
    // item, so they are made once here (blocks x taps vectors, a few KiB)
    const index_t K = g.K(), nblk = flat ? (g.OH * g.OW + S::L - 1) / S::L : 0;
    AlignedArray<typename S::M> masks(nblk * K), tails(nblk);
    std::vector<signed char> valid(static_cast<size_t>(nblk * K));
    for (index_t b = 0; b < nblk; ++b) {
        FlatLanes<T, 1> fl;
        fl.init(b * S::L, std::min<index_t>(S::L, g.OH * g.OW - b * S::L), g.OW);
        fl.mask(0, 0, g.OH, g.OW, &tails.p[b]);
        for (index_t i = 0; i < g.kh; ++i)
            for (index_t j = 0; j < g.kw; ++j)
                valid[b * K + i * g.kw + j] = static_cast<signed char>(
                    fl.mask(i * g.dh - g.ph, j * g.dw - g.pw, g.H, g.W, &masks.p[b * K + i * g.kw + j]));
    }
    a.masks = masks.p, a.valid = valid.data(), a.tails = tails.p;
    // 3 channels x 3 taps of accumulators + 3 gradients + 1 input: 13 registers
    const int B = g.Og == 1 ? 1 : 3;
    RangeFn<T> fn = B == 1 ? pick<T, BackwardFilter<T, 1>>() : pick<T, BackwardFilter<T, 3>>();
    const index_t items = g.G * ((g.Og + B - 1) / B) * g.Cg;
    const double work = double(B) * g.N * g.OH * g.OW * g.K();
    py::gil_scoped_release nogil;
    run_items<T>(fn, a, items, work);
}

template <typename T>
void bias_grad_t(py::handle gyo, py::handle gbo) {
    auto gy = checked<T>(gyo, "gy", false);
    auto gb = checked<T>(gbo, "gb", true);
    require(gy.ndim() >= 2, "argument 'gy' must be at least 2-D (N, C, ...), got shape " + shape_str(gy));
    const index_t N = gy.shape(0), C = gy.shape(1), L = trailing_size(gy, 2);
    check_shape(gb, "gb", {C});
    check_no_overlap(gy, "gy", gb, "gb");
    const T* gp = gy.data();
    T* bp = gb.mutable_data();
    py::gil_scoped_release nogil;
    MINIDNN_OMP_FOR(N * C * L >= kParallelGrain && C > 1)
    for (index_t c = 0; c < C; ++c) {
        double s[4] = {0, 0, 0, 0};  // four interleaved partial sums, added in order
        for (index_t n = 0; n < N; ++n) {
            const T* p = gp + (n * C + c) * L;
            index_t l = 0;
            for (; l + 4 <= L; l += 4)
                for (int k = 0; k < 4; ++k) s[k] += p[l + k];
            for (; l < L; ++l) s[l % 4] += p[l];
        }
        bp[c] = static_cast<T>((s[0] + s[1]) + (s[2] + s[3]));
    }
}

}  // namespace

void conv2d_direct_backward_filter(py::object x, py::object gy, py::object gw, index_t sh,
                                   index_t sw, index_t ph, index_t pw, index_t dh, index_t dw,
                                   index_t groups) {
    const DType dt = float_dtype(as_ndarray(x, "x"), "x");
    dispatch(dt, [&](auto t) {
        backward_filter_t<decltype(t)>(x, gy, gw, sh, sw, ph, pw, dh, dw, groups);
    });
}

void conv2d_bias_grad(py::object gy, py::object gb) {
    const DType dt = float_dtype(as_ndarray(gy, "gy"), "gy");
    dispatch(dt, [&](auto t) { bias_grad_t<decltype(t)>(gy, gb); });
}

}  // namespace minidnn
