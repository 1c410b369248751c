// Elementwise kernels on contiguous arrays of any shape (compared by number of
// elements).  Outputs may be the very same array as an input (in-place), but
// must not partially overlap one.
#include "kernels.h"

namespace minidnn {
namespace {

// `obj` as a T array (writeable if asked) of as many elements as `ref`, sharing no memory with
// it unless it is `ref` itself (allow_identical) - or at all.
template <typename T>
py::array_t<T, py::array::c_style> like(py::handle obj, const char* name, const py::array& ref,
                                        const char* ref_name, bool writeable, bool allow_identical = true) {
    auto a = checked<T>(obj, name, writeable);
    if (a.size() != ref.size())
        throw py::value_error(std::string("arguments '") + ref_name + "' " + shape_str(ref) + " and '" +
                              name + "' " + shape_str(a) + " must have the same number of elements");
    check_no_overlap(ref, ref_name, a, name, allow_identical);
    return a;
}

// f(i) for every i in [0, n), spread over threads (memory-bound loops: a larger grain), without
// the GIL.
template <typename Fn>
void each(index_t n, Fn f) {
    py::gil_scoped_release nogil;
    MINIDNN_OMP_FOR(n >= 4 * kParallelGrain)
    for (index_t i = 0; i < n; ++i) f(i);
}

// y = max(x, 0); NaN stays NaN, as in PyTorch.
template <typename T>
void relu_forward_t(py::handle xo, py::handle yo) {
    auto x = checked<T>(xo, "x", false);
    auto y = like<T>(yo, "y", x, "x", true);
    const T* xp = x.data();
    T* yp = y.mutable_data();
    each(x.size(), [&](index_t i) {
        const T v = xp[i];
        yp[i] = v < T(0) ? T(0) : v;
    });
}

// out = a + b (out may be a or b); with b None, out = a (a copy).
template <typename T>
void add_t(py::handle ao, py::handle bo, py::handle oo) {
    auto a = checked<T>(ao, "a", false);
    auto out = like<T>(oo, "out", a, "a", true);
    const T* ap = a.data();
    T* op = out.mutable_data();
    if (bo.is_none()) {
        each(a.size(), [&](index_t i) { op[i] = ap[i]; });
        return;
    }
    auto b = like<T>(bo, "b", out, "out", false);
    const T* bp = b.data();
    each(a.size(), [&](index_t i) { op[i] = ap[i] + bp[i]; });
}

template <typename T>
void relu_backward_t(py::handle yo, py::handle gyo, py::handle gxo) {
    auto y = checked<T>(yo, "y", false);
    auto gy = checked<T>(gyo, "gy", false);
    auto gx = like<T>(gxo, "gx", y, "y", true);
    like<T>(gyo, "gy", gx, "gx", false);
    const T* yp = y.data();
    const T* gyp = gy.data();
    T* gxp = gx.mutable_data();
    each(y.size(), [&](index_t i) {
        // unconditional loads so that the select vectorises
        const T v = yp[i], g = gyp[i];
        gxp[i] = v > T(0) ? g : T(0);
    });
}

template <typename T>
void add_inplace_t(py::handle dsto, py::handle srco) {
    auto dst = checked<T>(dsto, "dst", true);
    auto src = like<T>(srco, "src", dst, "dst", false);
    T* dp = dst.mutable_data();
    const T* sp = src.data();
    each(dst.size(), [&](index_t i) { dp[i] += sp[i]; });
}

// One pass of PyTorch's SGD rule, in its order of operations (no contraction):
//   d = g + wd * p;  b = first ? d : m * b + (1 - damp) * d  (the last product only if damp != 0);
//   s = nesterov ? d + m * b : b (momentum) or d;  p -= lr * s.
template <typename T>
void sgd_update_t(py::handle po, py::handle go, py::handle bo, double lr, double momentum,
                  double dampening, double weight_decay, bool nesterov, bool first) {
    auto p = checked<T>(po, "p", true);
    auto g = like<T>(go, "g", p, "p", false, false);
    T* bp = nullptr;
    py::array_t<T, py::array::c_style> b;
    if (!bo.is_none()) {
        b = like<T>(bo, "buf", p, "p", true, false);
        like<T>(bo, "buf", g, "g", true, false);
        bp = b.mutable_data();
    }
    require(bp != nullptr || momentum == 0, "sgd_update: momentum needs a momentum buffer 'buf'");
    T* pp = p.mutable_data();
    const T* gp = g.data();
    const T lr_ = T(lr), m = T(momentum), keep = T(1 - dampening), wd = T(weight_decay);
    const bool decay = weight_decay != 0, damp = dampening != 0;
    each(p.size(), [&](index_t i) {
        const T d = decay ? pp[i] * wd + gp[i] : gp[i];
        T s = d;
        if (bp) {
            const T v = first ? d : bp[i] * m + (damp ? keep * d : d);
            bp[i] = v;
            s = nesterov ? d + v * m : v;
        }
        pp[i] -= s * lr_;
    });
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
