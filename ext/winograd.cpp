// Winograd F(2x2, 3x3) transforms for 3x3 stride-1 convolutions (Lavin & Gray).
//
// The convolution becomes 16 independent GEMMs, one per point t of the 4x4
// transformed tile: M[t] (O, P) = U[t] (O, C) @ V[t] (C, P), over P = N*TH*TW
// tiles of 2x2 outputs (TH = ceil(OH/2), TW = ceil(OW/2)); the GEMMs run in
// NumPy/BLAS, these kernels do the three transforms:
//   U = G g G^T        (filter, 3x3 -> 4x4)
//   V = B^T d B        (input tile, 4x4 -> 4x4)
//   Y = A^T m A        (output tile, 4x4 -> 2x2)
// with tile p = (n*TH + th)*TW + tw reading input rows 2*th - ph + [0, 4) and
// columns 2*tw - pw + [0, 4) (zero outside). Each output element is written by
// one thread in a fixed order: deterministic for any thread count.
#include <algorithm>
#include <cstring>

#include "kernels.h"

namespace minidnn {
namespace {

constexpr index_t kTileRun = 64;  // tiles of a row transformed together

template <typename T>
void filter_t(py::handle wo, py::handle uo, bool flip) {
    auto w = checked<T>(wo, "w", false);
    auto u = checked<T>(uo, "U", true);
    require(w.ndim() == 4 && w.shape(2) == 3 && w.shape(3) == 3,
            "argument 'w' must be (O, C, 3, 3), got shape " + shape_str(w));
    const index_t O = w.shape(0), C = w.shape(1);
    // flip: the filter of the backward-data pass, w'[c, o] = rot180(w[o, c]), as (16, C, O)
    if (flip)
        check_shape(u, "U", {16, C, O});
    else
        check_shape(u, "U", {16, O, C});
    check_no_overlap(w, "w", u, "U");
    const T* wp = w.data();
    T* up = u.mutable_data();
    py::gil_scoped_release nogil;
    const index_t OC = O * C;
    MINIDNN_OMP_FOR(OC * 16 >= kParallelGrain && OC > 1)
    for (index_t oc = 0; oc < OC; ++oc) {
        const T* g = wp + oc * 9;
        T k[3][3];
        for (int i = 0; i < 3; ++i)
            for (int j = 0; j < 3; ++j) k[i][j] = flip ? g[(2 - i) * 3 + (2 - j)] : g[i * 3 + j];
        T t[4][3];
        for (int j = 0; j < 3; ++j) {
            t[0][j] = k[0][j];
            t[1][j] = (k[0][j] + k[1][j] + k[2][j]) * T(0.5);
            t[2][j] = (k[0][j] - k[1][j] + k[2][j]) * T(0.5);
            t[3][j] = k[2][j];
        }
        const index_t o = oc / C, c = oc % C;
        const index_t dst = flip ? c * O + o : oc;
        for (int r = 0; r < 4; ++r) {
            const T v[4] = {t[r][0], (t[r][0] + t[r][1] + t[r][2]) * T(0.5),
                            (t[r][0] - t[r][1] + t[r][2]) * T(0.5), t[r][2]};
            for (int s = 0; s < 4; ++s) up[(r * 4 + s) * OC + dst] = v[s];
        }
    }
}

template <typename T>
void input_t(py::handle xo, py::handle vo, index_t ph, index_t pw) {
    auto x = checked<T>(xo, "x", false);
    auto v = checked<T>(vo, "V", true);
    require(x.ndim() == 4, "argument 'x' must be 4-D (N, C, H, W), got shape " + shape_str(x));
    require(ph >= 0 && pw >= 0, "padding must be >= 0");
    const index_t N = x.shape(0), C = x.shape(1), H = x.shape(2), W = x.shape(3);
    const index_t OH = H + 2 * ph - 2, OW = W + 2 * pw - 2;
    require(OH >= 1 && OW >= 1, "input " + shape_str(x) + " is too small for a 3x3 window");
    const index_t TH = (OH + 1) / 2, TW = (OW + 1) / 2, P = N * TH * TW;
    check_shape(v, "V", {16, C, P});
    check_no_overlap(x, "x", v, "V");
    const T* xp = x.data();
    T* vp = v.mutable_data();
    py::gil_scoped_release nogil;
    const index_t CN = C * N, CP = C * P;
    // A row of tiles is transformed into a local buffer, then each of its 16
    // points is copied to V as one contiguous run (16 scattered stores per
    // tile would touch 16 pages apart).
    MINIDNN_OMP_FOR(CN * TH * TW * 16 >= kParallelGrain && CN > 1)
    for (index_t cn = 0; cn < CN; ++cn) {
        const index_t c = cn / N, n = cn % N;
        const T* plane = xp + (n * C + c) * H * W;
        T buf[16][kTileRun];
        for (index_t th = 0; th < TH; ++th) {
            const index_t h0 = 2 * th - ph;
            for (index_t tw0 = 0; tw0 < TW; tw0 += kTileRun) {
                const index_t run = std::min<index_t>(kTileRun, TW - tw0);
                for (index_t k = 0; k < run; ++k) {
                    const index_t w0 = 2 * (tw0 + k) - pw;
                    T d[4][4];
                    const bool inside = h0 >= 0 && h0 + 4 <= H && w0 >= 0 && w0 + 4 <= W;
                    for (int r = 0; r < 4; ++r)
                        for (int q = 0; q < 4; ++q) {
                            const index_t ih = h0 + r, iw = w0 + q;
                            d[r][q] = (inside || (ih >= 0 && ih < H && iw >= 0 && iw < W))
                                          ? plane[ih * W + iw]
                                          : T(0);
                        }
                    T t[4][4];
                    for (int q = 0; q < 4; ++q) {
                        t[0][q] = d[0][q] - d[2][q];
                        t[1][q] = d[1][q] + d[2][q];
                        t[2][q] = d[2][q] - d[1][q];
                        t[3][q] = d[1][q] - d[3][q];
                    }
                    for (int r = 0; r < 4; ++r) {
                        buf[r * 4 + 0][k] = t[r][0] - t[r][2];
                        buf[r * 4 + 1][k] = t[r][1] + t[r][2];
                        buf[r * 4 + 2][k] = t[r][2] - t[r][1];
                        buf[r * 4 + 3][k] = t[r][1] - t[r][3];
                    }
                }
                T* dst = vp + c * P + (n * TH + th) * TW + tw0;
                for (int q = 0; q < 16; ++q)
                    std::memcpy(dst + q * CP, buf[q], static_cast<size_t>(run) * sizeof(T));
            }
        }
    }
}

template <typename T>
void output_t(py::handle mo, py::handle yo, py::handle bo) {
    auto m = checked<T>(mo, "M", false);
    auto y = checked<T>(yo, "y", true);
    require(y.ndim() == 4, "argument 'y' must be 4-D (N, O, OH, OW), got shape " + shape_str(y));
    const index_t N = y.shape(0), O = y.shape(1), OH = y.shape(2), OW = y.shape(3);
    const index_t TH = (OH + 1) / 2, TW = (OW + 1) / 2, P = N * TH * TW;
    check_shape(m, "M", {16, O, P});
    check_no_overlap(m, "M", y, "y");
    const T* bp = nullptr;
    if (!bo.is_none()) {
        auto b = checked<T>(bo, "b", false);
        check_shape(b, "b", {O});
        bp = b.data();
    }
    const T* mp = m.data();
    T* yp = y.mutable_data();
    py::gil_scoped_release nogil;
    const index_t ON = O * N, OP = O * P;
    MINIDNN_OMP_FOR(ON * TH * TW * 16 >= kParallelGrain && ON > 1)
    for (index_t on = 0; on < ON; ++on) {
        const index_t o = on / N, n = on % N;
        T* plane = yp + (n * O + o) * OH * OW;
        const T bias = bp ? bp[o] : T(0);
        T buf[16][kTileRun];  // a row of tiles, each of the 16 points read as one run
        for (index_t th = 0; th < TH; ++th) {
            for (index_t tw0 = 0; tw0 < TW; tw0 += kTileRun) {
                const index_t run = std::min<index_t>(kTileRun, TW - tw0);
                const T* src = mp + o * P + (n * TH + th) * TW + tw0;
                for (int q = 0; q < 16; ++q)
                    std::memcpy(buf[q], src + q * OP, static_cast<size_t>(run) * sizeof(T));
                for (index_t k = 0; k < run; ++k) {
                    const index_t tw = tw0 + k;
                    T a[4][4];
                    for (int r = 0; r < 4; ++r)
                        for (int q = 0; q < 4; ++q) a[r][q] = buf[r * 4 + q][k];
                    T t[2][4];
                    for (int q = 0; q < 4; ++q) {
                        t[0][q] = a[0][q] + a[1][q] + a[2][q];
                        t[1][q] = a[1][q] - a[2][q] - a[3][q];
                    }
                    for (int r = 0; r < 2; ++r) {
                        const index_t oh = 2 * th + r;
                        if (oh >= OH) break;
                        T* row = plane + oh * OW + 2 * tw;
                        row[0] = t[r][0] + t[r][1] + t[r][2] + bias;
                        if (2 * tw + 1 < OW) row[1] = t[r][1] - t[r][2] - t[r][3] + bias;
                    }
                }
            }
        }
    }
}

}  // namespace

void winograd_filter_transform(py::object w, py::object u, bool flip) {
    const DType dt = float_dtype(as_ndarray(w, "w"), "w");
    dispatch(dt, [&](auto t) { filter_t<decltype(t)>(w, u, flip); });
}

void winograd_input_transform(py::object x, py::object v, index_t ph, index_t pw) {
    const DType dt = float_dtype(as_ndarray(x, "x"), "x");
    dispatch(dt, [&](auto t) { input_t<decltype(t)>(x, v, ph, pw); });
}

void winograd_output_transform(py::object m, py::object y, py::object b) {
    const DType dt = float_dtype(as_ndarray(m, "M"), "M");
    dispatch(dt, [&](auto t) { output_t<decltype(t)>(m, y, b); });
}

}  // namespace minidnn
