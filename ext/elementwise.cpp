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

}  // namespace

void relu_backward(py::object y, py::object gy, py::object gx) {
    const DType dt = float_dtype(as_ndarray(y, "y"), "y");
    dispatch(dt, [&](auto t) { relu_backward_t<decltype(t)>(y, gy, gx); });
}

void add_inplace(py::object dst, py::object src) {
    const DType dt = float_dtype(as_ndarray(dst, "dst"), "dst");
    dispatch(dt, [&](auto t) { add_inplace_t<decltype(t)>(dst, src); });
}

}  // namespace minidnn
