// Batch normalisation (training mode) over (N, C, *spatial) arrays.
//
// Reductions run in float64 whatever the input dtype, with 8 fixed
// accumulator lanes per channel (lane = position modulo 8 inside each (n, c)
// plane) combined in a fixed order at the end.  Each channel is reduced by
// exactly one thread, so results are bitwise reproducible for any thread
// count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels.h"

namespace minidnn {
namespace {

constexpr int kLanes = 8;

struct Acc {
    double a[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
    double total() const {
        return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    }
};

template <typename T>
inline void acc_sum(Acc& acc, const T* __restrict p, index_t L) {
    index_t l = 0;
    for (; l + kLanes <= L; l += kLanes)
        for (int k = 0; k < kLanes; ++k) acc.a[k] += static_cast<double>(p[l + k]);
    for (int k = 0; l < L; ++l, ++k) acc.a[k] += static_cast<double>(p[l]);
}

template <typename T>
inline void acc_sqdev(Acc& acc, const T* __restrict p, index_t L, double m) {
    index_t l = 0;
    for (; l + kLanes <= L; l += kLanes)
        for (int k = 0; k < kLanes; ++k) {
            const double d = static_cast<double>(p[l + k]) - m;
            acc.a[k] += d * d;
        }
    for (int k = 0; l < L; ++l, ++k) {
        const double d = static_cast<double>(p[l]) - m;
        acc.a[k] += d * d;
    }
}

// sum(g) and sum(g * (x - m))
template <typename T>
inline void acc_bwd(Acc& sg, Acc& sgx, const T* __restrict x, const T* __restrict g,
                    index_t L, double m) {
    index_t l = 0;
    for (; l + kLanes <= L; l += kLanes)
        for (int k = 0; k < kLanes; ++k) {
            const double gv = static_cast<double>(g[l + k]);
            sg.a[k] += gv;
            sgx.a[k] += gv * (static_cast<double>(x[l + k]) - m);
        }
    for (int k = 0; l < L; ++l, ++k) {
        const double gv = static_cast<double>(g[l]);
        sg.a[k] += gv;
        sgx.a[k] += gv * (static_cast<double>(x[l]) - m);
    }
}

struct NCL {
    index_t N, C, L;
};

NCL ncl_of(const py::array& x, const char* name) {
    if (x.ndim() < 2)
        throw py::value_error(std::string("argument '") + name +
                              "' must be at least 2-D (N, C, ...), got shape " + shape_str(x));
    return {x.shape(0), x.shape(1), trailing_size(x, 2)};
}

// Optional per-channel vector: None -> empty array_t (pointer stays null).
template <typename T>
const T* opt_vec(py::handle o, const char* name, index_t C,
                 py::array_t<T, py::array::c_style>* keep, bool writeable = false) {
    if (o.is_none()) return nullptr;
    *keep = checked<T>(o, name, writeable);
    check_shape(*keep, name, {C});
    return keep->data();
}

template <typename T>
void bn_stats_t(py::handle xo, py::handle mo, py::handle vo) {
    auto x = checked<T>(xo, "x", false);
    auto mean = checked<T>(mo, "mean", true);
    auto var = checked<T>(vo, "var", true);
    const NCL s = ncl_of(x, "x");
    check_shape(mean, "mean", {s.C});
    check_shape(var, "var", {s.C});
    require(s.N * s.L > 0, "bn_stats needs at least one value per channel, got x of shape " +
                               shape_str(x));
    check_no_overlap(mean, "mean", var, "var");
    check_no_overlap(x, "x", mean, "mean");
    check_no_overlap(x, "x", var, "var");
    const T* xp = x.data();
    T* mp = mean.mutable_data();
    T* vp = var.mutable_data();
    py::gil_scoped_release nogil;
    const double M = static_cast<double>(s.N * s.L);
    MINIDNN_OMP_FOR(s.C * s.N * s.L >= kParallelGrain && s.C > 1)
    for (index_t c = 0; c < s.C; ++c) {
        Acc a;
        for (index_t n = 0; n < s.N; ++n) acc_sum(a, xp + (n * s.C + c) * s.L, s.L);
        const double m = a.total() / M;
        Acc q;
        for (index_t n = 0; n < s.N; ++n) acc_sqdev(q, xp + (n * s.C + c) * s.L, s.L, m);
        mp[c] = static_cast<T>(m);
        vp[c] = static_cast<T>(q.total() / M);
    }
}

// One row of y = x * a + b; with ADD, + r (add's rounding); with RELU, relu_forward's select:
// bitwise what the separate steps give.
template <typename T, bool ADD, bool RELU>
inline void normalize_row(const T* __restrict xs, const T* __restrict rs, T* ys, T a, T b, index_t L) {
    for (index_t l = 0; l < L; ++l) {
        T v = xs[l] * a + b;
        if (ADD) v = v + rs[l];
        ys[l] = RELU ? (v < T(0) ? T(0) : v) : v;
    }
}

template <typename T>
void bn_forward_t(py::handle xo, py::handle go, py::handle bo, py::handle mo,
                  py::handle io, py::handle yo, bool relu, py::handle ro) {
    auto x = checked<T>(xo, "x", false);
    auto mean = checked<T>(mo, "mean", false);
    auto invstd = checked<T>(io, "invstd", false);
    auto y = checked<T>(yo, "y", true);
    const NCL s = ncl_of(x, "x");
    check_shape(mean, "mean", {s.C});
    check_shape(invstd, "invstd", {s.C});
    py::array_t<T, py::array::c_style> gk, bk;
    const T* gp = opt_vec<T>(go, "gamma", s.C, &gk);
    const T* bp = opt_vec<T>(bo, "beta", s.C, &bk);
    if (y.ndim() != x.ndim() || y.size() != x.size() || !std::equal(x.shape(), x.shape() + x.ndim(), y.shape()))
        throw py::value_error("argument 'y' has shape " + shape_str(y) +
                              ", expected the shape of 'x' " + shape_str(x));
    check_no_overlap(x, "x", y, "y", /*allow_identical=*/true);
    py::array_t<T, py::array::c_style> r;
    if (!ro.is_none()) {
        r = checked<T>(ro, "residual", false);
        if (r.ndim() != x.ndim() || !std::equal(x.shape(), x.shape() + x.ndim(), r.shape()))
            throw py::value_error("argument 'residual' has shape " + shape_str(r) +
                                  ", expected the shape of 'x' " + shape_str(x));
        check_no_overlap(r, "residual", y, "y", /*allow_identical=*/true);
    }
    const T* xp = x.data();
    const T* rp = ro.is_none() ? nullptr : r.data();
    const T* mp = mean.data();
    const T* ip = invstd.data();
    T* yp = y.mutable_data();
    auto row = rp ? (relu ? normalize_row<T, true, true> : normalize_row<T, true, false>)
                  : (relu ? normalize_row<T, false, true> : normalize_row<T, false, false>);
    py::gil_scoped_release nogil;
    // y = x * alpha + shift with alpha = invstd*gamma, shift = beta - mean*alpha
    // (coefficients computed in float64, as PyTorch's CPU kernel does).
    std::vector<T> alpha(static_cast<size_t>(s.C)), shift(static_cast<size_t>(s.C));
    for (index_t c = 0; c < s.C; ++c) {
        const double a = static_cast<double>(ip[c]) * (gp ? static_cast<double>(gp[c]) : 1.0);
        alpha[c] = static_cast<T>(a);
        shift[c] = static_cast<T>((bp ? static_cast<double>(bp[c]) : 0.0) -
                                  static_cast<double>(mp[c]) * a);
    }
    const index_t NC = s.N * s.C;
    MINIDNN_OMP_FOR(NC * s.L >= kParallelGrain && NC > 1)
    for (index_t nc = 0; nc < NC; ++nc) {
        const index_t c = nc % s.C;
        row(xp + nc * s.L, rp ? rp + nc * s.L : nullptr, yp + nc * s.L, alpha[c], shift[c], s.L);
    }
}

template <typename T>
void bn_backward_t(py::handle xo, py::handle gyo, py::handle go, py::handle mo,
                   py::handle io, py::handle gxo, py::handle ggo, py::handle gbo) {
    auto x = checked<T>(xo, "x", false);
    auto gy = checked<T>(gyo, "gy", false);
    auto mean = checked<T>(mo, "mean", false);
    auto invstd = checked<T>(io, "invstd", false);
    auto gx = checked<T>(gxo, "gx", true);
    const NCL s = ncl_of(x, "x");
    check_shape(mean, "mean", {s.C});
    check_shape(invstd, "invstd", {s.C});
    for (auto* p : {&gy, &gx}) {
        const char* nm = (p == &gy) ? "gy" : "gx";
        if (p->ndim() != x.ndim() || !std::equal(x.shape(), x.shape() + x.ndim(), p->shape()))
            throw py::value_error(std::string("argument '") + nm + "' has shape " +
                                  shape_str(*p) + ", expected the shape of 'x' " +
                                  shape_str(x));
    }
    require(s.N * s.L > 0, "bn_backward needs at least one value per channel, got x of shape " +
                               shape_str(x));
    py::array_t<T, py::array::c_style> gk, ggk, gbk;
    const T* gp = opt_vec<T>(go, "gamma", s.C, &gk);
    T* ggp = const_cast<T*>(opt_vec<T>(ggo, "ggamma", s.C, &ggk, true));
    T* gbp = const_cast<T*>(opt_vec<T>(gbo, "gbeta", s.C, &gbk, true));
    check_no_overlap(x, "x", gx, "gx", true);
    check_no_overlap(gy, "gy", gx, "gx", true);
    if (ggp) {
        check_no_overlap(ggk, "ggamma", x, "x");
        check_no_overlap(ggk, "ggamma", gy, "gy");
        check_no_overlap(ggk, "ggamma", gx, "gx");
    }
    if (gbp) {
        check_no_overlap(gbk, "gbeta", x, "x");
        check_no_overlap(gbk, "gbeta", gy, "gy");
        check_no_overlap(gbk, "gbeta", gx, "gx");
        if (ggp) check_no_overlap(ggk, "ggamma", gbk, "gbeta");
    }
    const T* xp = x.data();
    const T* gyp = gy.data();
    const T* mp = mean.data();
    const T* ip = invstd.data();
    T* gxp = gx.mutable_data();
    py::gil_scoped_release nogil;
    const index_t M = s.N * s.L;
    MINIDNN_OMP_FOR(s.C * M >= kParallelGrain && s.C > 1)
    for (index_t c = 0; c < s.C; ++c) {
        const double m = static_cast<double>(mp[c]);
        const double is = static_cast<double>(ip[c]);
        const double g = gp ? static_cast<double>(gp[c]) : 1.0;
        Acc sg, sgx;
        for (index_t n = 0; n < s.N; ++n) {
            const index_t off = (n * s.C + c) * s.L;
            acc_bwd(sg, sgx, xp + off, gyp + off, s.L, m);
        }
        const double gbeta = sg.total();
        const double dot = sgx.total();  // sum(gy * (x - mean))
        if (ggp) ggp[c] = static_cast<T>(dot * is);
        if (gbp) gbp[c] = static_cast<T>(gbeta);
        // gx = (gy - gbeta/M - (x - mean) * dot*invstd^2/M) * invstd*gamma
        const T k = static_cast<T>(dot * is * is / static_cast<double>(M));
        const T gm = static_cast<T>(gbeta / static_cast<double>(M));
        const T a = static_cast<T>(is * g);
        const T mt = static_cast<T>(m);
        for (index_t n = 0; n < s.N; ++n) {
            const index_t off = (n * s.C + c) * s.L;
            const T* xs = xp + off;
            const T* gs = gyp + off;
            T* out = gxp + off;
            for (index_t l = 0; l < s.L; ++l) out[l] = (gs[l] - gm - (xs[l] - mt) * k) * a;
        }
    }
}

}  // namespace

void bn_stats(py::object x, py::object mean, py::object var) {
    const DType dt = float_dtype(as_ndarray(x, "x"), "x");
    dispatch(dt, [&](auto t) { bn_stats_t<decltype(t)>(x, mean, var); });
}

void bn_forward_train(py::object x, py::object gamma, py::object beta,
                      py::object mean, py::object invstd, py::object y, bool relu,
                      py::object residual) {
    const DType dt = float_dtype(as_ndarray(x, "x"), "x");
    dispatch(dt, [&](auto t) {
        bn_forward_t<decltype(t)>(x, gamma, beta, mean, invstd, y, relu, residual);
    });
}

void bn_backward(py::object x, py::object gy, py::object gamma, py::object mean,
                 py::object invstd, py::object gx, py::object ggamma,
                 py::object gbeta) {
    const DType dt = float_dtype(as_ndarray(x, "x"), "x");
    dispatch(dt, [&](auto t) {
        bn_backward_t<decltype(t)>(x, gy, gamma, mean, invstd, gx, ggamma, gbeta);
    });
}

}  // namespace minidnn
