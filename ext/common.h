// Shared helpers for the minidnn CPU kernels: argument validation, dtype
// dispatch and OpenMP utilities.
//
// Every kernel receives its arrays as generic Python objects and validates
// them here, *without ever converting or copying*: an output array that is a
// view into the arena must be written in place, so a silent cast or a
// contiguous copy would be a bug.  Wrong types / dtypes raise TypeError, wrong
// layouts / shapes raise ValueError, and the message names the argument.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace minidnn {

namespace py = pybind11;
using index_t = std::int64_t;

// Work (in elements) below which a loop is not worth spreading over threads.
constexpr index_t kParallelGrain = 32768;

#if defined(_OPENMP)
#define MINIDNN_PRAGMA(x) _Pragma(#x)
#define MINIDNN_OMP_FOR(cond) MINIDNN_PRAGMA(omp parallel for schedule(static) if (cond))
#else
#define MINIDNN_OMP_FOR(cond)
#endif

// A loop kernel compiled for AVX-512 and AVX2 beside the baseline, the best chosen when the
// library loads (function multi-versioning, x86-64 ELF); the same results on every target, as
// nothing is contracted or reassociated.
#if defined(__x86_64__) && defined(__ELF__) && (defined(__GNUC__) || defined(__clang__))
#define MINIDNN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MINIDNN_CLONES
#endif

enum class DType { F32, F64 };

// Returns the argument as a numpy.ndarray (no conversion) or raises TypeError.
py::array as_ndarray(py::handle obj, const char* name);

// dtype of `arr` (float32 / float64) or TypeError naming `name`.
DType float_dtype(const py::array& arr, const char* name);

const char* dtype_name(DType dt);

// Checks that `obj` is a C-contiguous, aligned ndarray of dtype T (and
// writeable if `writeable`) and returns it as a typed view (no copy).
template <typename T>
py::array_t<T, py::array::c_style> checked(py::handle obj, const char* name,
                                           bool writeable);

// "(2, 3, 4)"
std::string shape_str(const py::array& a);

// Raises ValueError with the message if !cond.
inline void require(bool cond, const std::string& msg) {
    if (!cond) throw py::value_error(msg);
}

// Checks a.ndim == nd and a.shape == expected (entries < 0 are wildcards).
void check_shape(const py::array& a, const char* name,
                 const std::vector<index_t>& expected);

// Raises ValueError if the memory of `a` and `b` overlaps.  With
// allow_identical, two arrays starting at the same address with the same
// number of bytes are accepted (safe for purely elementwise kernels).
void check_no_overlap(const py::array& a, const char* na, const py::array& b,
                      const char* nb, bool allow_identical = false);

// Product of shape[from:].
index_t trailing_size(const py::array& a, int from);

// Output size of a sliding window (PyTorch formula, ceil_mode=False).
index_t out_size(index_t in, index_t k, index_t s, index_t p, index_t d);

// Validates window parameters and returns (OH, OW); raises ValueError if a
// parameter is out of range or the output would be empty.
void window_out_size(index_t H, index_t W, index_t kh, index_t kw, index_t sh,
                     index_t sw, index_t ph, index_t pw, index_t dh, index_t dw,
                     index_t* OH, index_t* OW);

// Dispatches `f.template operator()<T>()` on the dtype of the first array.
template <typename F>
decltype(auto) dispatch(DType dt, F&& f) {
    if (dt == DType::F32) return f(float{});
    return f(double{});
}

// Thread control (exposed to Python).
int get_num_threads();
void set_num_threads(int n);

}  // namespace minidnn
