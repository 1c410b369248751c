// 2-D adaptive average and max pooling (NCHW) over PyTorch's windows: output
// row i of OH reads input rows [floor(i*H/OH), ceil((i+1)*H/OH)), and columns
// likewise, so neighbouring windows may share a pixel and differ in size by
// one.  The output size is y's (gy's) shape.
//
// The max follows PyTorch's CPU kernel: the running max starts at -inf on the
// window's first pixel, and a later pixel (row-major order) replaces it only
// if strictly greater, or NaN; of equal maxima the first wins.  The backward
// recomputes the argmax from x (no index buffer).  Parallel over (n, c)
// planes, each plane handled by one thread in a fixed order => deterministic.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels.h"

namespace minidnn {
namespace {

// Window [lo[i], hi[i]) of each output i along one axis.
struct Windows {
    std::vector<index_t> lo, hi;
    Windows(index_t in, index_t out) : lo(out), hi(out) {
        for (index_t i = 0; i < out; ++i) {
            lo[i] = i * in / out;
            hi[i] = ((i + 1) * in + out - 1) / out;
        }
    }
};

struct AdaptiveGeom {
    index_t NC, H, W, OH, OW;
};

// x (N, C, H, W) pooled into y (N, C, OH, OW).
AdaptiveGeom adaptive_geom(const py::array& x, const char* xn, const py::array& y,
                           const char* yn) {
    check_shape(x, xn, {-1, -1, -1, -1});
    check_shape(y, yn, {x.shape(0), x.shape(1), -1, -1});
    const AdaptiveGeom g{x.shape(0) * x.shape(1), x.shape(2), x.shape(3), y.shape(2),
                         y.shape(3)};
    require(g.H >= 1 && g.W >= 1 && g.OH >= 1 && g.OW >= 1,
            std::string("adaptive pooling needs non-empty planes, got '") + xn + "' " +
                shape_str(x) + " and '" + yn + "' " + shape_str(y));
    require(g.H * g.W < (index_t(1) << 31),
            "pooling planes must hold fewer than 2**31 elements");
    return g;
}

// Index within the plane of the maximum of window (rows, cols), its value in *m.
template <typename T>
inline index_t window_argmax(const T* plane, index_t W, index_t h0, index_t h1,
                             index_t w0, index_t w1, T* m) {
    index_t best = h0 * W + w0;
    T bv = -std::numeric_limits<T>::infinity();
    for (index_t ih = h0; ih < h1; ++ih)
        for (index_t iw = w0; iw < w1; ++iw) {
            const T v = plane[ih * W + iw];
            if (v > bv || std::isnan(v)) {
                bv = v;
                best = ih * W + iw;
            }
        }
    *m = bv;
    return best;
}

template <typename T>
void avg_fwd_t(py::handle xo, py::handle yo) {
    auto x = checked<T>(xo, "x", false);
    auto y = checked<T>(yo, "y", true);
    const AdaptiveGeom g = adaptive_geom(x, "x", y, "y");
    check_no_overlap(x, "x", y, "y");
    const T* xp = x.data();
    T* yp = y.mutable_data();
    py::gil_scoped_release nogil;
    const Windows rows(g.H, g.OH), cols(g.W, g.OW);
    const index_t HW = g.H * g.W, L = g.OH * g.OW;
    MINIDNN_OMP_FOR(g.NC * (HW + L) >= kParallelGrain && g.NC > 1)
    for (index_t nc = 0; nc < g.NC; ++nc) {
        const T* plane = xp + nc * HW;
        T* out = yp + nc * L;
        for (index_t oh = 0; oh < g.OH; ++oh)
            for (index_t ow = 0; ow < g.OW; ++ow) {
                T s = T(0);
                for (index_t ih = rows.lo[oh]; ih < rows.hi[oh]; ++ih)
                    for (index_t iw = cols.lo[ow]; iw < cols.hi[ow]; ++iw)
                        s += plane[ih * g.W + iw];
                const index_t n = (rows.hi[oh] - rows.lo[oh]) * (cols.hi[ow] - cols.lo[ow]);
                out[oh * g.OW + ow] = s / static_cast<T>(n);
            }
    }
}

template <typename T>
void avg_bwd_t(py::handle gyo, py::handle gxo) {
    auto gy = checked<T>(gyo, "gy", false);
    auto gx = checked<T>(gxo, "gx", true);
    const AdaptiveGeom g = adaptive_geom(gx, "gx", gy, "gy");
    check_no_overlap(gy, "gy", gx, "gx");
    const T* gyp = gy.data();
    T* gxp = gx.mutable_data();
    py::gil_scoped_release nogil;
    const Windows rows(g.H, g.OH), cols(g.W, g.OW);
    const index_t HW = g.H * g.W, L = g.OH * g.OW;
    MINIDNN_OMP_FOR(g.NC * (HW + L) >= kParallelGrain && g.NC > 1)
    for (index_t nc = 0; nc < g.NC; ++nc) {
        const T* gout = gyp + nc * L;
        T* gin = gxp + nc * HW;
        std::fill(gin, gin + HW, T(0));
        for (index_t oh = 0; oh < g.OH; ++oh)
            for (index_t ow = 0; ow < g.OW; ++ow) {
                const index_t n = (rows.hi[oh] - rows.lo[oh]) * (cols.hi[ow] - cols.lo[ow]);
                const T d = gout[oh * g.OW + ow] / static_cast<T>(n);
                for (index_t ih = rows.lo[oh]; ih < rows.hi[oh]; ++ih)
                    for (index_t iw = cols.lo[ow]; iw < cols.hi[ow]; ++iw)
                        gin[ih * g.W + iw] += d;
            }
    }
}

template <typename T>
void max_fwd_t(py::handle xo, py::handle yo) {
    auto x = checked<T>(xo, "x", false);
    auto y = checked<T>(yo, "y", true);
    const AdaptiveGeom g = adaptive_geom(x, "x", y, "y");
    check_no_overlap(x, "x", y, "y");
    const T* xp = x.data();
    T* yp = y.mutable_data();
    py::gil_scoped_release nogil;
    const Windows rows(g.H, g.OH), cols(g.W, g.OW);
    const index_t HW = g.H * g.W, L = g.OH * g.OW;
    MINIDNN_OMP_FOR(g.NC * (HW + L) >= kParallelGrain && g.NC > 1)
    for (index_t nc = 0; nc < g.NC; ++nc) {
        const T* plane = xp + nc * HW;
        for (index_t oh = 0; oh < g.OH; ++oh)
            for (index_t ow = 0; ow < g.OW; ++ow)
                window_argmax(plane, g.W, rows.lo[oh], rows.hi[oh], cols.lo[ow], cols.hi[ow],
                              yp + nc * L + oh * g.OW + ow);
    }
}

template <typename T>
void max_bwd_t(py::handle xo, py::handle gyo, py::handle gxo) {
    auto x = checked<T>(xo, "x", false);
    auto gy = checked<T>(gyo, "gy", false);
    auto gx = checked<T>(gxo, "gx", true);
    const AdaptiveGeom g = adaptive_geom(x, "x", gy, "gy");
    check_shape(gx, "gx", {x.shape(0), x.shape(1), g.H, g.W});
    check_no_overlap(x, "x", gx, "gx");
    check_no_overlap(gy, "gy", gx, "gx");
    const T* xp = x.data();
    const T* gyp = gy.data();
    T* gxp = gx.mutable_data();
    py::gil_scoped_release nogil;
    const Windows rows(g.H, g.OH), cols(g.W, g.OW);
    const index_t HW = g.H * g.W, L = g.OH * g.OW;
    MINIDNN_OMP_FOR(g.NC * (HW + L) >= kParallelGrain && g.NC > 1)
    for (index_t nc = 0; nc < g.NC; ++nc) {
        const T* plane = xp + nc * HW;
        const T* gout = gyp + nc * L;
        T* gin = gxp + nc * HW;
        std::fill(gin, gin + HW, T(0));
        T m;
        for (index_t oh = 0; oh < g.OH; ++oh)
            for (index_t ow = 0; ow < g.OW; ++ow)
                gin[window_argmax(plane, g.W, rows.lo[oh], rows.hi[oh], cols.lo[ow],
                                  cols.hi[ow], &m)] += gout[oh * g.OW + ow];
    }
}

}  // namespace

void adaptive_avgpool2d_forward(py::object x, py::object y) {
    dispatch(float_dtype(as_ndarray(x, "x"), "x"), [&](auto t) { avg_fwd_t<decltype(t)>(x, y); });
}

void adaptive_avgpool2d_backward(py::object gy, py::object gx) {
    dispatch(float_dtype(as_ndarray(gy, "gy"), "gy"),
             [&](auto t) { avg_bwd_t<decltype(t)>(gy, gx); });
}

void adaptive_maxpool2d_forward(py::object x, py::object y) {
    dispatch(float_dtype(as_ndarray(x, "x"), "x"), [&](auto t) { max_fwd_t<decltype(t)>(x, y); });
}

void adaptive_maxpool2d_backward(py::object x, py::object gy, py::object gx) {
    dispatch(float_dtype(as_ndarray(x, "x"), "x"),
             [&](auto t) { max_bwd_t<decltype(t)>(x, gy, gx); });
}

}  // namespace minidnn
