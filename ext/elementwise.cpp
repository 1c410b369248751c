// Elementwise kernels on contiguous arrays of any shape (compared by number of
// elements).  Outputs may be the very same array as an input (in-place), but
// must not partially overlap one.
#include "kernels.h"

namespace minidnn {
namespace {

void check_same_size(const py::array& a, const char* na, const py::array& b,
                     const char* nb) {
    if (a.size() != b.size())
        throw py::value_error(std::string("arguments '") + na + "' " + shape_str(a) +
                              " and '" + nb + "' " + shape_str(b) +
                              " must have the same number of elements");
}

// y = max(x, 0); NaN stays NaN, as in PyTorch.
template <typename T>
void relu_forward_t(py::handle xo, py::handle yo) {
    auto x = checked<T>(xo, "x", false);
    auto y = checked<T>(yo, "y", true);
    check_same_size(x, "x", y, "y");
    check_no_overlap(x, "x", y, "y", true);
    const T* xp = x.data();
    T* yp = y.mutable_data();
    const index_t n = x.size();
    py::gil_scoped_release nogil;
    MINIDNN_OMP_FOR(n >= 4 * kParallelGrain)
    for (index_t i = 0; i < n; ++i) {
        const T v = xp[i];
        yp[i] = v < T(0) ? T(0) : v;
    }
}

// out = a + b (out may be a or b); with b None, out = a (a copy).
template <typename T>
void add_t(py::handle ao, py::handle bo, py::handle oo) {
    auto a = checked<T>(ao, "a", false);
    auto out = checked<T>(oo, "out", true);
    check_same_size(a, "a", out, "out");
    check_no_overlap(a, "a", out, "out", true);
    py::array_t<T, py::array::c_style> b;
    if (!bo.is_none()) {
        b = checked<T>(bo, "b", false);
        check_same_size(a, "a", b, "b");
        check_no_overlap(b, "b", out, "out", true);
    }
    const T* ap = a.data();
    const T* bp = bo.is_none() ? nullptr : b.data();
    T* op = out.mutable_data();
    const index_t n = a.size();
    py::gil_scoped_release nogil;
    MINIDNN_OMP_FOR(n >= 4 * kParallelGrain)
    for (index_t i = 0; i < n; ++i) op[i] = bp ? ap[i] + bp[i] : ap[i];
}

template <typename T>
void relu_backward_t(py::handle yo, py::handle gyo, py::handle gxo) {
    auto y = checked<T>(yo, "y", false);
    auto gy = checked<T>(gyo, "gy", false);
    auto gx = checked<T>(gxo, "gx", true);
    check_same_size(y, "y", gy, "gy");
    check_same_size(y, "y", gx, "gx");
    check_no_overlap(y, "y", gx, "gx", true);
    check_no_overlap(gy, "gy", gx, "gx", true);
    const T* yp = y.data();
    const T* gyp = gy.data();
    T* gxp = gx.mutable_data();
    const index_t n = y.size();
    py::gil_scoped_release nogil;
    MINIDNN_OMP_FOR(n >= 4 * kParallelGrain)
    for (index_t i = 0; i < n; ++i) {
        // unconditional loads so that the select vectorises
        const T v = yp[i], g = gyp[i];
        gxp[i] = v > T(0) ? g : T(0);
    }
}

template <typename T>
void add_inplace_t(py::handle dsto, py::handle srco) {
    auto dst = checked<T>(dsto, "dst", true);
    auto src = checked<T>(srco, "src", false);
    check_same_size(dst, "dst", src, "src");
    check_no_overlap(dst, "dst", src, "src", true);
    T* dp = dst.mutable_data();
    const T* sp = src.data();
    const index_t n = dst.size();
    py::gil_scoped_release nogil;
    MINIDNN_OMP_FOR(n >= 4 * kParallelGrain)
    for (index_t i = 0; i < n; ++i) dp[i] += sp[i];
}

// One pass of PyTorch's SGD rule, in its order of operations (no contraction):
//   d = g + wd * p;  b = first ? d : m * b + (1 - damp) * d  (the last product only if damp != 0);
//   s = nesterov ? d + m * b : b (momentum) or d;  p -= lr * s.
template <typename T>
void sgd_update_t(py::handle po, py::handle go, py::handle bo, double lr, double momentum,
                  double dampening, double weight_decay, bool nesterov, bool first) {
    auto p = checked<T>(po, "p", true);
    auto g = checked<T>(go, "g", false);
    check_same_size(p, "p", g, "g");
    check_no_overlap(p, "p", g, "g");
    T* bp = nullptr;
    if (!bo.is_none()) {
        auto b = checked<T>(bo, "buf", true);
        check_same_size(p, "p", b, "buf");
        check_no_overlap(p, "p", b, "buf");
        check_no_overlap(g, "g", b, "buf");
        bp = b.mutable_data();
    }
    require(bp != nullptr || momentum == 0, "sgd_update: momentum needs a momentum buffer 'buf'");
    T* pp = p.mutable_data();
    const T* gp = g.data();
    const T lr_ = T(lr), m = T(momentum), keep = T(1 - dampening), wd = T(weight_decay);
    const bool decay = weight_decay != 0, damp = dampening != 0;
    const index_t n = p.size();
    py::gil_scoped_release nogil;
    MINIDNN_OMP_FOR(n >= 4 * kParallelGrain)
    for (index_t i = 0; i < n; ++i) {
        const T d = decay ? pp[i] * wd + gp[i] : gp[i];
        T s = d;
        if (bp) {
            const T b = first ? d : bp[i] * m + (damp ? keep * d : d);
            bp[i] = b;
            s = nesterov ? d + b * m : b;
        }
        pp[i] -= s * lr_;
    }
}

}  // namespace

void sgd_update(py::object p, py::object g, py::object buf, double lr, double momentum,
                double dampening, double weight_decay, bool nesterov, bool first) {
    const DType dt = float_dtype(as_ndarray(p, "p"), "p");
    dispatch(dt, [&](auto t) {
        sgd_update_t<decltype(t)>(p, g, buf, lr, momentum, dampening, weight_decay, nesterov, first);
    });
}

void relu_forward(py::object x, py::object y) {
    const DType dt = float_dtype(as_ndarray(x, "x"), "x");
    dispatch(dt, [&](auto t) { relu_forward_t<decltype(t)>(x, y); });
}

void add(py::object a, py::object b, py::object out) {
    const DType dt = float_dtype(as_ndarray(a, "a"), "a");
    dispatch(dt, [&](auto t) { add_t<decltype(t)>(a, b, out); });
}

void relu_backward(py::object y, py::object gy, py::object gx) {
    const DType dt = float_dtype(as_ndarray(y, "y"), "y");
    dispatch(dt, [&](auto t) { relu_backward_t<decltype(t)>(y, gy, gx); });
}

void add_inplace(py::object dst, py::object src) {
    const DType dt = float_dtype(as_ndarray(dst, "dst"), "dst");
    dispatch(dt, [&](auto t) { add_inplace_t<decltype(t)>(dst, src); });
}

}  // namespace minidnn
