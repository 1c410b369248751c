// Winograd F(mxm, 3x3) transforms for 3x3 stride-1 convolutions (Lavin & Gray), m = 2 or 4, all
// three passes.
//
// A convolution becomes a*a independent GEMMs (a = m + 2), one per point t of the a x a
// transformed tile, over P = N*TH*TW tiles of m x m outputs (TH = ceil(OH/m), TW = ceil(OW/m));
// tile p = (n*TH + th)*TW + tw reads input rows m*th - ph + [0, a) and columns m*tw - pw + [0, a)
// (zero outside). The GEMMs run in NumPy/BLAS; these kernels do the transforms:
//   forward          U = G g G^T  (filter)     V = B^T d B  (input)    M[t] = U[t] V[t]
//                    y = A^T m A  (output)
//   backward-data    the forward of gy padded by 2 - p, by the flipped, transposed filter
//   backward-filter  Z = A g A^T  (gradient)   V  (input)              D[t] = Z[t] V[t]^T
//                    gw = G^T d G (filter gradient)
// Each 2-D transform is a 1-D one down the columns, then along the rows. F2 and F4 below hold
// the 1-D transforms of each tile size, the rest is shared.
//
// A plane's tiles are consecutive in p, so each transform works plane by plane: the plane is
// copied once into a zero-padded buffer, and each of the a*a points is read or written as one
// contiguous run of TH*TW tiles, the arithmetic looping over positions (vectorizable). Each output
// element is written by one thread in a fixed order: deterministic for any thread count.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels.h"

namespace minidnn {
namespace {

// The 1-D transforms of each tile size, from inputs x to outputs o. F(2x2, 3x3): 4x4 tiles.
struct F2 {
    static constexpr int m = 2, a = 4;
    template <typename T>
    static void input(const T* x, T* o) {  // B^T d
        o[0] = x[0] - x[2];
        o[1] = x[1] + x[2];
        o[2] = x[2] - x[1];
        o[3] = x[1] - x[3];
    }
    template <typename T>
    static void output(const T* x, T* o) {  // A^T m
        o[0] = x[0] + x[1] + x[2];
        o[1] = x[1] - x[2] - x[3];
    }
    template <typename T>
    static void filter(const T* x, T* o) {  // G g
        o[0] = x[0];
        o[1] = (x[0] + x[1] + x[2]) * T(0.5);
        o[2] = (x[0] - x[1] + x[2]) * T(0.5);
        o[3] = x[2];
    }
    template <typename T>
    static void gradient(const T* x, T* o) {  // A g
        o[0] = x[0];
        o[1] = x[0] + x[1];
        o[2] = x[0] - x[1];
        o[3] = -x[1];
    }
    template <typename T>
    static void filter_gradient(const T* x, T* o) {  // G^T d
        o[0] = x[0] + (x[1] + x[2]) * T(0.5);
        o[1] = (x[1] - x[2]) * T(0.5);
        o[2] = (x[1] + x[2]) * T(0.5) + x[3];
    }
};

// F(4x4, 3x3): 6x6 tiles, interpolation points 0, +-1, +-2 (Lavin & Gray's matrices).
struct F4 {
    static constexpr int m = 4, a = 6;
    template <typename T>
    static void input(const T* x, T* o) {  // B^T d
        o[0] = T(4) * x[0] - T(5) * x[2] + x[4];
        o[1] = (x[3] + x[4]) - T(4) * (x[1] + x[2]);
        o[2] = (x[4] - x[3]) + T(4) * (x[1] - x[2]);
        o[3] = (x[4] - x[2]) + T(2) * (x[3] - x[1]);
        o[4] = (x[4] - x[2]) - T(2) * (x[3] - x[1]);
        o[5] = T(4) * x[1] - T(5) * x[3] + x[5];
    }
    template <typename T>
    static void output(const T* x, T* o) {  // A^T m
        const T s12 = x[1] + x[2], d12 = x[1] - x[2], s34 = x[3] + x[4], d34 = x[3] - x[4];
        o[0] = x[0] + s12 + s34;
        o[1] = d12 + T(2) * d34;
        o[2] = s12 + T(4) * s34;
        o[3] = d12 + T(8) * d34 + x[5];
    }
    template <typename T>
    static void filter(const T* x, T* o) {  // G g
        o[0] = x[0] * T(0.25);
        o[1] = -(x[0] + x[1] + x[2]) * T(1.0 / 6);
        o[2] = -(x[0] - x[1] + x[2]) * T(1.0 / 6);
        o[3] = x[0] * T(1.0 / 24) + x[1] * T(1.0 / 12) + x[2] * T(1.0 / 6);
        o[4] = x[0] * T(1.0 / 24) - x[1] * T(1.0 / 12) + x[2] * T(1.0 / 6);
        o[5] = x[2];
    }
    template <typename T>
    static void gradient(const T* x, T* o) {  // A g
        o[0] = x[0];
        o[1] = x[0] + x[1] + x[2] + x[3];
        o[2] = x[0] - x[1] + x[2] - x[3];
        o[3] = x[0] + T(2) * x[1] + T(4) * x[2] + T(8) * x[3];
        o[4] = x[0] - T(2) * x[1] + T(4) * x[2] - T(8) * x[3];
        o[5] = x[3];
    }
    template <typename T>
    static void filter_gradient(const T* x, T* o) {  // G^T d
        o[0] = x[0] * T(0.25) - (x[1] + x[2]) * T(1.0 / 6) + (x[3] + x[4]) * T(1.0 / 24);
        o[1] = (x[2] - x[1]) * T(1.0 / 6) + (x[3] - x[4]) * T(1.0 / 12);
        o[2] = (x[3] + x[4] - x[1] - x[2]) * T(1.0 / 6) + x[5];
    }
};

// Applies the 1-D transform t (I inputs, O outputs) to n items: item k's j-th input is
// in[j*is + k*ik], its i-th output goes to out[i*os + k*ok] (in and out apart). Items one apart
// on both sides, as down the columns of a plane, take the loop that vectorizes.
template <int I, int O, typename T, typename Transform>
MINIDNN_CLONES void apply(Transform t, const T* __restrict in, index_t is, index_t ik, T* __restrict out,
                          index_t os, index_t ok, index_t n) {
    T x[I], o[O];
    if (ik == 1 && ok == 1) {
        for (index_t k = 0; k < n; ++k) {
            for (int j = 0; j < I; ++j) x[j] = in[j * is + k];
            t(x, o);
            for (int i = 0; i < O; ++i) out[i * os + k] = o[i];
        }
        return;
    }
    for (index_t k = 0; k < n; ++k) {
        for (int j = 0; j < I; ++j) x[j] = in[j * is + k * ik];
        t(x, o);
        for (int i = 0; i < O; ++i) out[i * os + k * ok] = o[i];
    }
}

constexpr index_t kBlocks = 64;     // planes are split into at most this many blocks, one scratch each
constexpr int kFilterRun = 64;      // filters transformed together

// Calls fn(i0, n) for the runs [i0, i0 + n) of kFilterRun of `count` filters, spread over threads.
template <typename Fn>
void filter_runs(index_t count, index_t work, Fn fn) {
    const index_t runs = (count + kFilterRun - 1) / kFilterRun;
    MINIDNN_OMP_FOR(work >= kParallelGrain && runs > 1)
    for (index_t r = 0; r < runs; ++r) fn(r * kFilterRun, std::min<index_t>(kFilterRun, count - r * kFilterRun));
}

// The 2-D transform t (I x I to O x O, separable) of n filters: in[(i*I + j)*kFilterRun + k] to
// out[(i*O + j)*kFilterRun + k], down the columns into mid, then along the rows.
template <int I, int O, typename T, typename Transform>
void filters_2d(Transform t, const T* in, T* mid, T* out, index_t n) {
    constexpr index_t R = kFilterRun;
    for (int j = 0; j < I; ++j) apply<I, O>(t, in + j * R, I * R, 1, mid + j * R, I * R, 1, n);
    for (int i = 0; i < O; ++i) apply<I, O>(t, mid + I * i * R, R, 1, out + O * i * R, R, 1, n);
}

// Calls fn(i, scratch) for i in [0, count) in blocks spread over threads; each block owns a
// scratch vector of `scratch` elements.
template <typename T, typename Fn>
void planes(index_t count, index_t work, index_t scratch, Fn fn) {
    const index_t blocks = std::min(count, kBlocks);
    MINIDNN_OMP_FOR(work >= kParallelGrain && blocks > 1)
    for (index_t b = 0; b < blocks; ++b) {
        std::vector<T> buf(static_cast<size_t>(scratch));
        for (index_t i = count * b / blocks; i < count * (b + 1) / blocks; ++i) fn(i, buf.data());
    }
}

// Copies plane (H, W) into pad (Hp, Wp), its element (i, j) at (i + ph, j + pw), zero elsewhere.
template <typename T>
void pad_plane(const T* plane, index_t H, index_t W, index_t ph, index_t pw, T* pad, index_t Hp,
               index_t Wp) {
    std::fill(pad, pad + Hp * Wp, T(0));
    const index_t h1 = std::min(H, Hp - ph), w1 = std::min(W, Wp - pw);
    for (index_t i = 0; i < h1 && w1 > 0; ++i)
        std::memcpy(pad + (i + ph) * Wp + pw, plane + i * W, static_cast<size_t>(w1) * sizeof(T));
}

// Tiles along an output side of n.
template <typename F>
index_t tiles(index_t n) {
    return (n + F::m - 1) / F::m;
}

// ValueError naming w unless it is a filter (O, C, 3, 3).
void check_filter(const py::array& w, const char* name) {
    require(w.ndim() == 4 && w.shape(2) == 3 && w.shape(3) == 3,
            std::string("argument '") + name + "' must be (O, C, 3, 3), got shape " + shape_str(w));
}

// The separable transform t (I x I taps to O x O) of `count` filters, from src to dst, each
// laid out by filter ((count, taps): a filter's taps together, reversed on reading with flip)
// or by tap ((taps, count): one run of all filters per tap).
template <int I, int O, typename T, typename Transform>
void transform_filters(Transform t, const T* src, bool src_by_filter, bool flip, T* dst, bool dst_by_filter,
                       index_t count) {
    constexpr index_t R = kFilterRun;
    py::gil_scoped_release nogil;
    filter_runs(count, count * O * O, [&](index_t i0, index_t n) {
        T in[I * I * R], mid[I * O * R], out[O * O * R];   // tap e of filter i0 + k at [e * R + k]
        for (int e = 0; e < I * I; ++e) {
            if (src_by_filter)
                for (index_t k = 0; k < n; ++k) in[e * R + k] = src[(i0 + k) * I * I + (flip ? I * I - 1 - e : e)];
            else
                std::memcpy(in + e * R, src + e * count + i0, static_cast<size_t>(n) * sizeof(T));
        }
        filters_2d<I, O>(t, in, mid, out, n);
        for (int e = 0; e < O * O; ++e) {
            if (dst_by_filter)
                for (index_t k = 0; k < n; ++k) dst[(i0 + k) * O * O + e] = out[e * R + k];
            else
                std::memcpy(dst + e * count + i0, out + e * R, static_cast<size_t>(n) * sizeof(T));
        }
    });
}

template <typename T, typename F>
void filter_t(py::handle wo, py::handle uo, bool flip) {
    constexpr int a = F::a;
    auto w = checked<T>(wo, "w", false);
    auto u = checked<T>(uo, "U", true);
    check_filter(w, "w");
    // flip: each filter turned by 180 degrees, rot180(w[o, c]): the backward-data pass's filter
    // w'[c, o], whose transpose the GEMM reads
    check_shape(u, "U", {a * a, w.shape(0), w.shape(1)});
    check_no_overlap(w, "w", u, "U");
    const auto filt = [](const T* x, T* o) { F::filter(x, o); };   // G g G^T
    transform_filters<3, a>(filt, w.data(), true, flip, u.mutable_data(), false, w.shape(0) * w.shape(1));
}

template <typename T, typename F>
void filter_gradient_t(py::handle do_, py::handle gwo) {
    constexpr int a = F::a;
    auto d = checked<T>(do_, "D", false);
    auto gw = checked<T>(gwo, "gw", true);
    check_filter(gw, "gw");
    check_shape(d, "D", {a * a, gw.shape(0), gw.shape(1)});
    check_no_overlap(d, "D", gw, "gw");
    const auto fgrad = [](const T* x, T* o) { F::filter_gradient(x, o); };   // G^T d G
    transform_filters<a, 3>(fgrad, d.data(), false, false, gw.mutable_data(), true, gw.shape(0) * gw.shape(1));
}

// The a*a points of every tile of src (N, C, H, W) padded by (ph, pw) into dst (a*a, C, N*TH*TW):
// the separable transform t (I x I windows, m apart, to a x a) down the columns of each padded
// plane, then along its rows.
template <int I, int a, int m, typename T, typename Transform>
void to_tiles(Transform t, const T* src, index_t N, index_t C, index_t H, index_t W, index_t ph,
              index_t pw, index_t TH, index_t TW, T* dst) {
    const index_t Hp = m * (TH - 1) + I, Wp = m * (TW - 1) + I, T2 = TH * TW, CP = C * N * T2;
    // scratch: the padded plane, then its columns transformed: a rows per row of tiles
    planes<T>(C * N, a * a * CP, Hp * Wp + a * TH * Wp, [&](index_t cn, T* buf) {
        const index_t c = cn / N, n = cn % N;
        T *pad = buf, *col = buf + Hp * Wp;
        pad_plane(src + (n * C + c) * H * W, H, W, ph, pw, pad, Hp, Wp);
        for (index_t th = 0; th < TH; ++th)
            apply<I, a>(t, pad + m * th * Wp, Wp, 1, col + a * th * Wp, Wp, 1, Wp);
        T* d = dst + (c * N + n) * T2;
        for (int r = 0; r < a; ++r)
            for (index_t th = 0; th < TH; ++th)
                apply<I, a>(t, col + (a * th + r) * Wp, 1, m, d + a * r * CP + th * TW, CP, 1, TW);
    });
}

template <typename T, typename F>
void input_t(py::handle xo, py::handle vo, index_t ph, index_t pw) {
    constexpr int a = F::a;
    auto x = checked<T>(xo, "x", false);
    auto v = checked<T>(vo, "V", true);
    require(x.ndim() == 4, "argument 'x' must be 4-D (N, C, H, W), got shape " + shape_str(x));
    require(ph >= 0 && pw >= 0, "padding must be >= 0");
    const index_t N = x.shape(0), C = x.shape(1), H = x.shape(2), W = x.shape(3);
    const index_t OH = H + 2 * ph - 2, OW = W + 2 * pw - 2;
    require(OH >= 1 && OW >= 1, "input " + shape_str(x) + " is too small for a 3x3 window");
    const index_t TH = tiles<F>(OH), TW = tiles<F>(OW);
    check_shape(v, "V", {a * a, C, N * TH * TW});
    check_no_overlap(x, "x", v, "V");
    const T* xp = x.data();
    T* vp = v.mutable_data();
    py::gil_scoped_release nogil;
    const auto inp = [](const T* x, T* o) { F::input(x, o); };   // B^T d B
    to_tiles<a, a, F::m>(inp, xp, N, C, H, W, ph, pw, TH, TW, vp);
}

template <typename T, typename F>
void gradient_t(py::handle gyo, py::handle zo) {
    constexpr int a = F::a, mm = F::m;
    auto gy = checked<T>(gyo, "gy", false);
    auto z = checked<T>(zo, "Z", true);
    require(gy.ndim() == 4, "argument 'gy' must be 4-D (N, O, OH, OW), got shape " + shape_str(gy));
    const index_t N = gy.shape(0), O = gy.shape(1), OH = gy.shape(2), OW = gy.shape(3);
    const index_t TH = tiles<F>(OH), TW = tiles<F>(OW);
    check_shape(z, "Z", {a * a, O, N * TH * TW});
    check_no_overlap(gy, "gy", z, "Z");
    const T* gp = gy.data();
    T* zp = z.mutable_data();
    py::gil_scoped_release nogil;
    const auto grad = [](const T* x, T* o) { F::gradient(x, o); };   // A g A^T, on m x m tiles
    to_tiles<mm, a, mm>(grad, gp, N, O, OH, OW, 0, 0, TH, TW, zp);
}

template <typename T, typename F>
void output_t(py::handle mo, py::handle yo, py::handle bo) {
    constexpr int a = F::a, mm = F::m;
    auto m = checked<T>(mo, "M", false);
    auto y = checked<T>(yo, "y", true);
    require(y.ndim() == 4, "argument 'y' must be 4-D (N, O, OH, OW), got shape " + shape_str(y));
    const index_t N = y.shape(0), O = y.shape(1), OH = y.shape(2), OW = y.shape(3);
    const index_t TH = tiles<F>(OH), TW = tiles<F>(OW);
    const index_t T2 = TH * TW, P = N * T2;
    check_shape(m, "M", {a * a, O, P});
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
    const auto outp = [](const T* x, T* o) { F::output(x, o); };
    const index_t OP = O * P, Wq = mm * TW;
    // scratch: A^T m per tile (m rows x a columns), then the plane in whole tiles
    planes<T>(O * N, a * a * OP, mm * a * T2 + mm * TH * Wq, [&](index_t on, T* buf) {
        const index_t o = on / N, n = on % N;
        T *s = buf, *out = buf + mm * a * T2;
        const T* src = mp + o * P + n * T2;
        for (int q = 0; q < a; ++q) apply<a, mm>(outp, src + q * OP, a * OP, 1, s + q * T2, a * T2, 1, T2);
        for (int i = 0; i < mm; ++i)
            for (index_t th = 0; th < TH; ++th)
                apply<a, mm>(outp, s + a * i * T2 + th * TW, T2, 1, out + (mm * th + i) * Wq, 1, mm, TW);
        T* plane = yp + (n * O + o) * OH * OW;
        const T bias = bp ? bp[o] : T(0);
        for (index_t r = 0; r < OH; ++r) {
            T* row = plane + r * OW;
            std::memcpy(row, out + r * Wq, static_cast<size_t>(OW) * sizeof(T));
            if (bp)
                for (index_t j = 0; j < OW; ++j) row[j] += bias;
        }
    });
}

// Calls fn(F2{}) or fn(F4{}) for tile size m.
template <typename Fn>
void tile_size(index_t m, Fn fn) {
    require(m == 2 || m == 4, "Winograd output tile must be 2 or 4, got " + std::to_string(m));
    if (m == 2)
        fn(F2{});
    else
        fn(F4{});
}

}  // namespace

void winograd_filter_transform(py::object w, py::object u, bool flip, index_t m) {
    const DType dt = float_dtype(as_ndarray(w, "w"), "w");
    tile_size(m, [&](auto f) {
        dispatch(dt, [&](auto t) { filter_t<decltype(t), decltype(f)>(w, u, flip); });
    });
}

void winograd_input_transform(py::object x, py::object v, index_t ph, index_t pw, index_t m) {
    const DType dt = float_dtype(as_ndarray(x, "x"), "x");
    tile_size(m, [&](auto f) {
        dispatch(dt, [&](auto t) { input_t<decltype(t), decltype(f)>(x, v, ph, pw); });
    });
}

void winograd_output_transform(py::object mo, py::object y, py::object b, index_t m) {
    const DType dt = float_dtype(as_ndarray(mo, "M"), "M");
    tile_size(m, [&](auto f) {
        dispatch(dt, [&](auto t) { output_t<decltype(t), decltype(f)>(mo, y, b); });
    });
}

void winograd_gradient_transform(py::object gy, py::object z, index_t m) {
    const DType dt = float_dtype(as_ndarray(gy, "gy"), "gy");
    tile_size(m, [&](auto f) {
        dispatch(dt, [&](auto t) { gradient_t<decltype(t), decltype(f)>(gy, z); });
    });
}

void winograd_filter_gradient(py::object d, py::object gw, index_t m) {
    const DType dt = float_dtype(as_ndarray(d, "D"), "D");
    tile_size(m, [&](auto f) {
        dispatch(dt, [&](auto t) { filter_gradient_t<decltype(t), decltype(f)>(d, gw); });
    });
}

}  // namespace minidnn
