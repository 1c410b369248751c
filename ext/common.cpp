// Argument validation and thread-control helpers (see common.h).
#include "common.h"

#include <sstream>

namespace minidnn {

py::array as_ndarray(py::handle obj, const char* name) {
    if (!py::isinstance<py::array>(obj)) {
        throw py::type_error(std::string("argument '") + name +
                             "' must be a numpy.ndarray, got " +
                             std::string(py::str(py::type::of(obj).attr("__name__"))));
    }
    return py::reinterpret_borrow<py::array>(obj);
}

const char* dtype_name(DType dt) { return dt == DType::F32 ? "float32" : "float64"; }

DType float_dtype(const py::array& arr, const char* name) {
    if (arr.dtype().equal(py::dtype::of<float>())) return DType::F32;
    if (arr.dtype().equal(py::dtype::of<double>())) return DType::F64;
    throw py::type_error(std::string("argument '") + name +
                         "' must have dtype float32 or float64 (native byte order), got " +
                         std::string(py::str(arr.dtype())));
}

template <typename T>
py::array_t<T, py::array::c_style> checked(py::handle obj, const char* name,
                                           bool writeable) {
    py::array a = as_ndarray(obj, name);
    if (!a.dtype().equal(py::dtype::of<T>())) {
        throw py::type_error(std::string("argument '") + name + "' has dtype " +
                             std::string(py::str(a.dtype())) + " but " +
                             (sizeof(T) == 4 ? "float32" : "float64") +
                             " is required (all arrays of a call must share one dtype)");
    }
    const int flags = a.flags();
    if (!(flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_)) {
        throw py::value_error(std::string("argument '") + name +
                              "' must be C-contiguous (pass np.ascontiguousarray(...) "
                              "for inputs; outputs must be contiguous views)");
    }
    if (!(flags & py::detail::npy_api::NPY_ARRAY_ALIGNED_)) {
        throw py::value_error(std::string("argument '") + name + "' must be aligned");
    }
    if (writeable && !(flags & py::detail::npy_api::NPY_ARRAY_WRITEABLE_)) {
        throw py::value_error(std::string("argument '") + name +
                              "' is an output and must be writeable");
    }
    return py::reinterpret_borrow<py::array_t<T, py::array::c_style>>(a);
}

template py::array_t<float, py::array::c_style> checked<float>(py::handle, const char*, bool);
template py::array_t<double, py::array::c_style> checked<double>(py::handle, const char*, bool);

std::string shape_str(const py::array& a) {
    std::ostringstream os;
    os << "(";
    for (py::ssize_t i = 0; i < a.ndim(); ++i) {
        if (i) os << ", ";
        os << a.shape(i);
    }
    if (a.ndim() == 1) os << ",";
    os << ")";
    return os.str();
}

void check_shape(const py::array& a, const char* name,
                 const std::vector<index_t>& expected) {
    bool ok = a.ndim() == static_cast<py::ssize_t>(expected.size());
    for (size_t i = 0; ok && i < expected.size(); ++i)
        if (expected[i] >= 0 && a.shape(i) != expected[i]) ok = false;
    if (!ok) {
        std::ostringstream os;
        os << "argument '" << name << "' has shape " << shape_str(a)
           << ", expected (";
        for (size_t i = 0; i < expected.size(); ++i) {
            if (i) os << ", ";
            if (expected[i] < 0)
                os << "*";
            else
                os << expected[i];
        }
        if (expected.size() == 1) os << ",";
        os << ")";
        throw py::value_error(os.str());
    }
}

void check_no_overlap(const py::array& a, const char* na, const py::array& b,
                      const char* nb, bool allow_identical) {
    const auto a0 = reinterpret_cast<std::uintptr_t>(a.data());
    const auto b0 = reinterpret_cast<std::uintptr_t>(b.data());
    const auto a1 = a0 + static_cast<std::uintptr_t>(a.nbytes());
    const auto b1 = b0 + static_cast<std::uintptr_t>(b.nbytes());
    if (a.nbytes() == 0 || b.nbytes() == 0) return;
    if (allow_identical && a0 == b0 && a1 == b1) return;
    if (a0 < b1 && b0 < a1) {
        throw py::value_error(std::string("arguments '") + na + "' and '" + nb +
                              "' must not overlap in memory" +
                              (allow_identical ? " (except being the very same array)" : ""));
    }
}

index_t trailing_size(const py::array& a, int from) {
    index_t s = 1;
    for (py::ssize_t i = from; i < a.ndim(); ++i) s *= a.shape(i);
    return s;
}

index_t out_size(index_t in, index_t k, index_t s, index_t p, index_t d) {
    const index_t span = in + 2 * p - d * (k - 1) - 1;
    if (span < 0) return 0;  // avoid C++ truncation towards zero
    return span / s + 1;
}

void window_out_size(index_t H, index_t W, index_t kh, index_t kw, index_t sh,
                     index_t sw, index_t ph, index_t pw, index_t dh, index_t dw,
                     index_t* OH, index_t* OW) {
    require(kh >= 1 && kw >= 1, "kernel size must be >= 1, got kh=" + std::to_string(kh) +
                                    ", kw=" + std::to_string(kw));
    require(sh >= 1 && sw >= 1, "stride must be >= 1, got sh=" + std::to_string(sh) +
                                    ", sw=" + std::to_string(sw));
    require(ph >= 0 && pw >= 0, "padding must be >= 0, got ph=" + std::to_string(ph) +
                                    ", pw=" + std::to_string(pw));
    require(dh >= 1 && dw >= 1, "dilation must be >= 1, got dh=" + std::to_string(dh) +
                                    ", dw=" + std::to_string(dw));
    *OH = out_size(H, kh, sh, ph, dh);
    *OW = out_size(W, kw, sw, pw, dw);
    require(*OH >= 1 && *OW >= 1,
            "window does not fit: input " + std::to_string(H) + "x" + std::to_string(W) +
                " with kernel " + std::to_string(kh) + "x" + std::to_string(kw) +
                ", padding " + std::to_string(ph) + "x" + std::to_string(pw) +
                ", dilation " + std::to_string(dh) + "x" + std::to_string(dw) +
                " gives output size " + std::to_string(*OH) + "x" + std::to_string(*OW));
}

int get_num_threads() {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

void set_num_threads(int n) {
    require(n >= 1, "number of threads must be >= 1, got " + std::to_string(n));
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
}

}  // namespace minidnn
