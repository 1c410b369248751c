// im2col / col2im with the batch folded into the columns, and the NCHW <-> CN
// layout transposes used around the convolution GEMMs.
//
//   cols[(c*kh + i)*kw + j, n*OH*OW + oh*OW + ow]
//       = x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw]   (0 outside)
//
// so that W(O, C*kh*kw) @ cols gives (O, N*OH*OW).
#include <algorithm>
#include <cstring>

#include "kernels.h"

namespace minidnn {
namespace {

// Range [lo, hi) of output positions o (0 <= o < O) for which
// o*s + off lies in [0, in).
inline void valid_range(index_t O, index_t in, index_t s, index_t off,
                        index_t* lo, index_t* hi) {
    index_t l = off >= 0 ? 0 : (-off + s - 1) / s;
    index_t h = (in - 1 - off) < 0 ? 0 : (in - 1 - off) / s + 1;
    l = std::min(l, O);
    h = std::min(std::max(h, l), O);
    *lo = l;
    *hi = h;
}

struct Geom {
    index_t N, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW;
};

template <typename T>
void im2col_kernel(const T* __restrict x, T* __restrict cols, const Geom& g) {
    const index_t R = g.C * g.kh * g.kw;
    const index_t L = g.OH * g.OW;
    const index_t NL = g.N * L;
    const index_t HW = g.H * g.W;
    // One thread per block of rows: each row (c, i, j) is a contiguous span of
    // N*OH*OW outputs, filled in order.
    MINIDNN_OMP_FOR(R * NL >= kParallelGrain && R > 1)
    for (index_t r = 0; r < R; ++r) {
        const index_t j = r % g.kw;
        const index_t i = (r / g.kw) % g.kh;
        const index_t c = r / (g.kw * g.kh);
        const index_t hoff = i * g.dh - g.ph;  // ih = oh*sh + hoff
        const index_t woff = j * g.dw - g.pw;  // iw = ow*sw + woff
        index_t oh_lo, oh_hi, ow_lo, ow_hi;
        valid_range(g.OH, g.H, g.sh, hoff, &oh_lo, &oh_hi);
        valid_range(g.OW, g.W, g.sw, woff, &ow_lo, &ow_hi);
        const index_t nvalid = ow_hi - ow_lo;
        T* row = cols + r * NL;
        for (index_t n = 0; n < g.N; ++n) {
            const T* plane = x + (n * g.C + c) * HW;
            T* dst = row + n * L;
            if (oh_lo > 0) std::fill(dst, dst + oh_lo * g.OW, T(0));
            for (index_t oh = oh_lo; oh < oh_hi; ++oh) {
                T* d = dst + oh * g.OW;
                const T* src = plane + (oh * g.sh + hoff) * g.W;
                for (index_t ow = 0; ow < ow_lo; ++ow) d[ow] = T(0);
                if (g.sw == 1) {
                    if (nvalid > 0)
                        std::memcpy(d + ow_lo, src + ow_lo + woff,
                                    static_cast<size_t>(nvalid) * sizeof(T));
                } else if (g.sw == 2) {
                    const T* s = src + 2 * ow_lo + woff;
                    T* dd = d + ow_lo;
                    for (index_t k = 0; k < nvalid; ++k) dd[k] = s[2 * k];
                } else {
                    const index_t sw = g.sw;
                    const T* s = src + sw * ow_lo + woff;
                    T* dd = d + ow_lo;
                    for (index_t k = 0; k < nvalid; ++k) dd[k] = s[sw * k];
                }
                for (index_t ow = ow_hi; ow < g.OW; ++ow) d[ow] = T(0);
            }
            if (oh_hi < g.OH) std::fill(dst + oh_hi * g.OW, dst + L, T(0));
        }
    }
}

template <typename T>
void col2im_kernel(const T* __restrict cols, T* __restrict x, const Geom& g) {
    const index_t L = g.OH * g.OW;
    const index_t NL = g.N * L;
    const index_t HW = g.H * g.W;
    const index_t NC = g.N * g.C;
    // Each (n, c) plane is owned by one thread and accumulated in the fixed
    // order (i, j, oh, ow): deterministic whatever the thread count.
    MINIDNN_OMP_FOR(NC * g.kh * g.kw * L >= kParallelGrain && NC > 1)
    for (index_t nc = 0; nc < NC; ++nc) {
        const index_t n = nc / g.C;
        const index_t c = nc % g.C;
        T* plane = x + nc * HW;
        std::fill(plane, plane + HW, T(0));
        for (index_t i = 0; i < g.kh; ++i) {
            const index_t hoff = i * g.dh - g.ph;
            index_t oh_lo, oh_hi;
            valid_range(g.OH, g.H, g.sh, hoff, &oh_lo, &oh_hi);
            for (index_t j = 0; j < g.kw; ++j) {
                const index_t woff = j * g.dw - g.pw;
                index_t ow_lo, ow_hi;
                valid_range(g.OW, g.W, g.sw, woff, &ow_lo, &ow_hi);
                const index_t nvalid = ow_hi - ow_lo;
                if (nvalid <= 0) continue;
                const T* src = cols + ((c * g.kh + i) * g.kw + j) * NL + n * L;
                for (index_t oh = oh_lo; oh < oh_hi; ++oh) {
                    T* xr = plane + (oh * g.sh + hoff) * g.W + g.sw * ow_lo + woff;
                    const T* s = src + oh * g.OW + ow_lo;
                    if (g.sw == 1) {
                        for (index_t k = 0; k < nvalid; ++k) xr[k] += s[k];
                    } else if (g.sw == 2) {
                        for (index_t k = 0; k < nvalid; ++k) xr[2 * k] += s[k];
                    } else {
                        const index_t sw = g.sw;
                        for (index_t k = 0; k < nvalid; ++k) xr[sw * k] += s[k];
                    }
                }
            }
        }
    }
}

Geom make_geom(const py::array& x, index_t kh, index_t kw, index_t sh,
               index_t sw, index_t ph, index_t pw, index_t dh, index_t dw) {
    if (x.ndim() != 4)
        throw py::value_error("argument 'x' must be 4-D (N, C, H, W), got shape " +
                              shape_str(x));
    Geom g{x.shape(0), x.shape(1), x.shape(2), x.shape(3), kh, kw, sh, sw,
           ph,         pw,         dh,         dw,         0,  0};
    window_out_size(g.H, g.W, kh, kw, sh, sw, ph, pw, dh, dw, &g.OH, &g.OW);
    return g;
}

template <typename T>
void im2col_t(py::handle xo, py::handle co, index_t kh, index_t kw, index_t sh,
              index_t sw, index_t ph, index_t pw, index_t dh, index_t dw) {
    auto x = checked<T>(xo, "x", false);
    auto cols = checked<T>(co, "cols", true);
    const Geom g = make_geom(x, kh, kw, sh, sw, ph, pw, dh, dw);
    check_shape(cols, "cols", {g.C * kh * kw, g.N * g.OH * g.OW});
    check_no_overlap(x, "x", cols, "cols");
    const T* xp = x.data();
    T* cp = cols.mutable_data();
    py::gil_scoped_release nogil;
    im2col_kernel<T>(xp, cp, g);
}

template <typename T>
void col2im_t(py::handle co, py::handle xo, index_t kh, index_t kw, index_t sh,
              index_t sw, index_t ph, index_t pw, index_t dh, index_t dw) {
    auto cols = checked<T>(co, "cols", false);
    auto x = checked<T>(xo, "x", true);
    const Geom g = make_geom(x, kh, kw, sh, sw, ph, pw, dh, dw);
    check_shape(cols, "cols", {g.C * kh * kw, g.N * g.OH * g.OW});
    check_no_overlap(x, "x", cols, "cols");
    const T* cp = cols.data();
    T* xp = x.mutable_data();
    py::gil_scoped_release nogil;
    col2im_kernel<T>(cp, xp, g);
}

// out[c, n*L + l] = x[n, c, l]
template <typename T>
void nchw_to_cn_t(py::handle xo, py::handle oo) {
    auto x = checked<T>(xo, "x", false);
    auto out = checked<T>(oo, "out", true);
    if (x.ndim() < 2)
        throw py::value_error("argument 'x' must be at least 2-D (N, C, ...), got shape " +
                              shape_str(x));
    const index_t N = x.shape(0), C = x.shape(1), L = trailing_size(x, 2);
    check_shape(out, "out", {C, N * L});
    check_no_overlap(x, "x", out, "out");
    const T* xp = x.data();
    T* op = out.mutable_data();
    py::gil_scoped_release nogil;
    const index_t CN = C * N;
    MINIDNN_OMP_FOR(CN * L >= kParallelGrain && CN > 1)
    for (index_t cn = 0; cn < CN; ++cn) {
        const index_t c = cn / N, n = cn % N;
        const T* __restrict s = xp + (n * C + c) * L;
        T* __restrict d = op + cn * L;
        for (index_t l = 0; l < L; ++l) d[l] = s[l];
    }
}

// out[n, c, l] (=|+=) src[c, n*L + l]
template <typename T>
void cn_to_nchw_t(py::handle so, py::handle oo, bool accumulate) {
    auto src = checked<T>(so, "src", false);
    auto out = checked<T>(oo, "out", true);
    if (out.ndim() < 2)
        throw py::value_error("argument 'out' must be at least 2-D (N, C, ...), got shape " +
                              shape_str(out));
    const index_t N = out.shape(0), C = out.shape(1), L = trailing_size(out, 2);
    check_shape(src, "src", {C, N * L});
    check_no_overlap(src, "src", out, "out");
    const T* sp = src.data();
    T* op = out.mutable_data();
    py::gil_scoped_release nogil;
    const index_t NC = N * C;
    MINIDNN_OMP_FOR(NC * L >= kParallelGrain && NC > 1)
    for (index_t nc = 0; nc < NC; ++nc) {
        const index_t n = nc / C, c = nc % C;
        const T* __restrict s = sp + (c * N + n) * L;
        T* __restrict d = op + nc * L;
        if (accumulate) {
            for (index_t l = 0; l < L; ++l) d[l] += s[l];
        } else {
            for (index_t l = 0; l < L; ++l) d[l] = s[l];
        }
    }
}

}  // namespace

void im2col(py::object x, py::object cols, index_t kh, index_t kw, index_t sh,
            index_t sw, index_t ph, index_t pw, index_t dh, index_t dw) {
    const DType dt = float_dtype(as_ndarray(x, "x"), "x");
    dispatch(dt, [&](auto t) {
        im2col_t<decltype(t)>(x, cols, kh, kw, sh, sw, ph, pw, dh, dw);
    });
}

void col2im(py::object cols, py::object x, index_t kh, index_t kw, index_t sh,
            index_t sw, index_t ph, index_t pw, index_t dh, index_t dw) {
    const DType dt = float_dtype(as_ndarray(cols, "cols"), "cols");
    dispatch(dt, [&](auto t) {
        col2im_t<decltype(t)>(cols, x, kh, kw, sh, sw, ph, pw, dh, dw);
    });
}

void nchw_to_cn(py::object x, py::object out) {
    const DType dt = float_dtype(as_ndarray(x, "x"), "x");
    dispatch(dt, [&](auto t) { nchw_to_cn_t<decltype(t)>(x, out); });
}

void cn_to_nchw(py::object src, py::object out, bool accumulate) {
    const DType dt = float_dtype(as_ndarray(src, "src"), "src");
    dispatch(dt, [&](auto t) { cn_to_nchw_t<decltype(t)>(src, out, accumulate); });
}

}  // namespace minidnn
