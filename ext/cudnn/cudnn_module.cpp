// minidnn._cudnn: minidnn's own binding of cuDNN's convolutions (the legacy
// descriptor API, present in cuDNN 8 and 9).
//
// Device memory and streams cross the boundary as plain integers (a device
// pointer, a cudaStream_t), so the binding needs neither CuPy nor the CUDA
// runtime library: CuPy owns the memory and the streams, this module only
// hands their addresses to cuDNN. Nothing here allocates device memory - the
// workspace of every call is a buffer the caller planned.
//
// Every failing cuDNN call raises minidnn._cudnn.CudnnError (a RuntimeError)
// whose message holds cuDNN's status string and the call that failed, and
// whose ``status`` attribute is the numeric status.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cudnn.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

struct CudnnFailure : std::runtime_error {
    int status;
    CudnnFailure(int s, const std::string& msg) : std::runtime_error(msg), status(s) {}
};

void check(cudnnStatus_t s, const char* what) {
    if (s != CUDNN_STATUS_SUCCESS)
        throw CudnnFailure(static_cast<int>(s),
                           std::string(cudnnGetErrorString(s)) + " (" + std::to_string(static_cast<int>(s)) +
                               ") in " + what);
}
#define CHECK(call) check((call), #call)

// Whether a status says "not supported for this layer". cuDNN 9 reports it as a category
// (CUDNN_STATUS_NOT_SUPPORTED = 3000) with sub-codes 3001-3014 (..._SHAPE, ..._ARCH_MISMATCH,
// ..._SHARED_MEMORY_INSUFFICIENT, e.g. for Winograd on Hopper); cuDNN 8 has the one code.
bool not_supported(int s) {
#ifdef CUDNN_STATUS_CATEGORY
    return CUDNN_STATUS_CATEGORY(s) == static_cast<int>(CUDNN_STATUS_NOT_SUPPORTED);
#else
    return s == static_cast<int>(CUDNN_STATUS_NOT_SUPPORTED);
#endif
}

// Workspace bytes of a workspace query, None where the algorithm is not supported, else CudnnError.
py::object ws_or_none(int s, std::size_t bytes, const char* what) {
    if (not_supported(s)) return py::none();
    check(static_cast<cudnnStatus_t>(s), what);
    return py::int_(bytes);
}

template <typename T>
T* ptr(std::uintptr_t p) { return reinterpret_cast<T*>(p); }

cudnnDataType_t data_type(const std::string& dtype) {
    if (dtype == "float32") return CUDNN_DATA_FLOAT;
    if (dtype == "float64") return CUDNN_DATA_DOUBLE;
    if (dtype == "float16") return CUDNN_DATA_HALF;
#if CUDNN_VERSION >= 8100
    if (dtype == "bfloat16") return CUDNN_DATA_BFLOAT16;
#endif
    throw py::type_error("cuDNN convolution dtype must be float32, float64, float16 or bfloat16 (cuDNN 8.1+), got " +
                         dtype);
}

bool is_16bit(cudnnDataType_t dt) {
#if CUDNN_VERSION >= 8100
    if (dt == CUDNN_DATA_BFLOAT16) return true;
#endif
    return dt == CUDNN_DATA_HALF;
}

// Mixed precision's convolutions: 16-bit data and filters, accumulated in float (cuDNN's
// PSEUDO_HALF / PSEUDO_BFLOAT16 configurations); float and double accumulate in their own type.
cudnnDataType_t compute_type(cudnnDataType_t dt) { return is_16bit(dt) ? CUDNN_DATA_FLOAT : dt; }

// The math type a descriptor runs with unless a call names the one Find timed: tensor cores for
// 16-bit data (TENSOR_OP: permitted, no down-conversion of the inputs); otherwise DEFAULT (TF32
// for float) where the caller allows tensor ops and plain FMA where not, so float results stay
// float-accurate.
cudnnMathType_t default_math(cudnnDataType_t dt, bool allow_tensor_ops) {
    if (is_16bit(dt)) return CUDNN_TENSOR_OP_MATH;
    return allow_tensor_ops ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

// The enumerators' names, without the common prefix; index = enum value.
const std::vector<std::string> kFwdNames = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                            "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
const std::vector<std::string> kBwdDataNames = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD",
                                                "WINOGRAD_NONFUSED"};
const std::vector<std::string> kBwdFilterNames = {"ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD",
                                                  "WINOGRAD_NONFUSED", "FFT_TILING"};
static_assert(CUDNN_CONVOLUTION_FWD_ALGO_COUNT == 8, "forward algorithm names out of date");
static_assert(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT == 6, "backward-data algorithm names out of date");
static_assert(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT == 7, "backward-filter algorithm names out of date");

// One result of Find or Get_v7: (algo, status, seconds or -1, workspace bytes, deterministic, tensor ops,
// math type). Find lists an algorithm once per math type it tried: the math type is what a call must
// set on the descriptor to run the variant that was timed, with the workspace that was measured.
using Perf = std::tuple<int, int, double, std::size_t, bool, bool, int>;

template <typename P>
Perf perf(const P& p) {
    return Perf(static_cast<int>(p.algo), static_cast<int>(p.status), p.time < 0 ? -1.0 : p.time * 1e-3,
                p.memory, p.determinism == CUDNN_DETERMINISTIC,
                p.mathType != CUDNN_DEFAULT_MATH && p.mathType != CUDNN_FMA_MATH, static_cast<int>(p.mathType));
}

// A cuDNN handle bound to one stream.
class Handle {
  public:
    explicit Handle(std::uintptr_t stream) {
        CHECK(cudnnCreate(&h_));
        try {
            set_stream(stream);
        } catch (...) {
            cudnnDestroy(h_);
            throw;
        }
    }
    ~Handle() { close(); }
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;

    void set_stream(std::uintptr_t stream) {
        CHECK(cudnnSetStream(get(), reinterpret_cast<cudaStream_t>(stream)));
        stream_ = stream;
    }
    std::uintptr_t stream() const { return stream_; }
    void close() {
        if (h_ != nullptr) cudnnDestroy(h_);
        h_ = nullptr;
    }
    cudnnHandle_t get() const {
        if (h_ == nullptr) throw std::runtime_error("this cuDNN handle is closed");
        return h_;
    }

  private:
    cudnnHandle_t h_ = nullptr;
    std::uintptr_t stream_ = 0;
};

// The descriptors of one convolution: x (N, C, H, W), w (O, C/groups, kh, kw), y (N, O, OH, OW), NCHW.
class Conv {
  public:
    // ``allow_tensor_ops``: TF32 for float data; 16-bit data runs on tensor cores either way (default_math).
    Conv(int n, int c, int h, int w, int o, int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw,
         int groups, const std::string& dtype, bool allow_tensor_ops)
        : double_(dtype == "float64"), default_math_(default_math(data_type(dtype), allow_tensor_ops)) {
        cudnnDataType_t dt = data_type(dtype);
        if (c % groups || o % groups) throw py::value_error("channels must be divisible by groups");
        try {
            CHECK(cudnnCreateTensorDescriptor(&x_));
            CHECK(cudnnCreateTensorDescriptor(&y_));
            CHECK(cudnnCreateFilterDescriptor(&w_));
            CHECK(cudnnCreateConvolutionDescriptor(&conv_));
            CHECK(cudnnSetTensor4dDescriptor(x_, CUDNN_TENSOR_NCHW, dt, n, c, h, w));
            CHECK(cudnnSetFilter4dDescriptor(w_, dt, CUDNN_TENSOR_NCHW, o, c / groups, kh, kw));
            CHECK(cudnnSetConvolution2dDescriptor(conv_, ph, pw, sh, sw, dh, dw, CUDNN_CROSS_CORRELATION,
                                                  compute_type(dt)));
            CHECK(cudnnSetConvolutionGroupCount(conv_, groups));
            CHECK(cudnnSetConvolutionMathType(conv_, default_math_));
            math_ = default_math_;
            int on, oc, oh, ow;
            CHECK(cudnnGetConvolution2dForwardOutputDim(conv_, x_, w_, &on, &oc, &oh, &ow));
            CHECK(cudnnSetTensor4dDescriptor(y_, CUDNN_TENSOR_NCHW, dt, on, oc, oh, ow));
            out_ = {on, oc, oh, ow};
        } catch (...) {
            destroy();
            throw;
        }
    }
    ~Conv() { destroy(); }
    Conv(const Conv&) = delete;
    Conv& operator=(const Conv&) = delete;

    std::vector<int> output_shape() const { return out_; }

    // The types the descriptors hold, read back from cuDNN: (x, filter, y, compute) data types and
    // the descriptor's default math type, as cudnnDataType_t / cudnnMathType_t values.
    std::tuple<int, int, int, int, int> types() const {
        cudnnDataType_t xt, yt, wt, ct;
        cudnnTensorFormat_t fmt;
        cudnnConvolutionMode_t mode;
        int v[10];
        CHECK(cudnnGetTensor4dDescriptor(x_, &xt, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]));
        CHECK(cudnnGetTensor4dDescriptor(y_, &yt, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]));
        CHECK(cudnnGetFilter4dDescriptor(w_, &wt, &fmt, &v[0], &v[1], &v[2], &v[3]));
        CHECK(cudnnGetConvolution2dDescriptor(conv_, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &mode, &ct));
        return {static_cast<int>(xt), static_cast<int>(wt), static_cast<int>(yt), static_cast<int>(ct),
                static_cast<int>(default_math_)};
    }

    // Workspace bytes of one algorithm with math type ``math`` (-1: the descriptor's own), or None
    // where cuDNN does not support it for this layer.
    py::object forward_workspace(const Handle& h, int algo, int math) {
        std::size_t b = 0;
        set_math(math);
        return ws_or_none(cudnnGetConvolutionForwardWorkspaceSize(
                              h.get(), x_, w_, conv_, y_, static_cast<cudnnConvolutionFwdAlgo_t>(algo), &b),
                          b, "cudnnGetConvolutionForwardWorkspaceSize");
    }
    py::object backward_data_workspace(const Handle& h, int algo, int math) {
        std::size_t b = 0;
        set_math(math);
        return ws_or_none(cudnnGetConvolutionBackwardDataWorkspaceSize(
                              h.get(), w_, y_, conv_, x_, static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), &b),
                          b, "cudnnGetConvolutionBackwardDataWorkspaceSize");
    }
    py::object backward_filter_workspace(const Handle& h, int algo, int math) {
        std::size_t b = 0;
        set_math(math);
        return ws_or_none(cudnnGetConvolutionBackwardFilterWorkspaceSize(
                              h.get(), x_, y_, conv_, w_, static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), &b),
                          b, "cudnnGetConvolutionBackwardFilterWorkspaceSize");
    }

    // Heuristics (no kernel runs): every algorithm, best first. The result arrays hold what cuDNN
    // says it may return (Get*AlgorithmMaxCount: an algorithm may come once per math type), not
    // the enumerators' count.
    std::vector<Perf> forward_heuristics(const Handle& h) {
        int n = 0;
        CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h.get(), &n));
        std::vector<cudnnConvolutionFwdAlgoPerf_t> r(std::max(n, 1));
        int got = 0;
        set_math(-1);
        CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h.get(), x_, w_, conv_, y_, static_cast<int>(r.size()), &got,
                                                     r.data()));
        return perfs(r, got);
    }
    std::vector<Perf> backward_data_heuristics(const Handle& h) {
        int n = 0;
        CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h.get(), &n));
        std::vector<cudnnConvolutionBwdDataAlgoPerf_t> r(std::max(n, 1));
        int got = 0;
        set_math(-1);
        CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h.get(), w_, y_, conv_, x_, static_cast<int>(r.size()),
                                                          &got, r.data()));
        return perfs(r, got);
    }
    std::vector<Perf> backward_filter_heuristics(const Handle& h) {
        int n = 0;
        CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h.get(), &n));
        std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> r(std::max(n, 1));
        int got = 0;
        set_math(-1);
        CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h.get(), x_, y_, conv_, w_, static_cast<int>(r.size()),
                                                            &got, r.data()));
        return perfs(r, got);
    }

    // Find: runs every algorithm on the caller's buffers (outputs are overwritten) with at most
    // ws_bytes of workspace at ws; measured times in seconds, fastest first. Synchronous.
    std::vector<Perf> find_forward(const Handle& h, std::uintptr_t x, std::uintptr_t w, std::uintptr_t y,
                                   std::uintptr_t ws, std::size_t ws_bytes) {
        int n = 0;
        CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h.get(), &n));
        std::vector<cudnnConvolutionFwdAlgoPerf_t> r(std::max(n, 1));
        int got = 0;
        set_math(-1);
        {
            py::gil_scoped_release nogil;
            CHECK(cudnnFindConvolutionForwardAlgorithmEx(h.get(), x_, ptr<void>(x), w_, ptr<void>(w), conv_, y_,
                                                         ptr<void>(y), static_cast<int>(r.size()), &got, r.data(),
                                                         ptr<void>(ws), ws_bytes));
        }
        return perfs(r, got);
    }
    std::vector<Perf> find_backward_data(const Handle& h, std::uintptr_t w, std::uintptr_t dy, std::uintptr_t dx,
                                         std::uintptr_t ws, std::size_t ws_bytes) {
        int n = 0;
        CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h.get(), &n));
        std::vector<cudnnConvolutionBwdDataAlgoPerf_t> r(std::max(n, 1));
        int got = 0;
        set_math(-1);
        {
            py::gil_scoped_release nogil;
            CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(h.get(), w_, ptr<void>(w), y_, ptr<void>(dy), conv_, x_,
                                                              ptr<void>(dx), static_cast<int>(r.size()), &got,
                                                              r.data(), ptr<void>(ws), ws_bytes));
        }
        return perfs(r, got);
    }
    std::vector<Perf> find_backward_filter(const Handle& h, std::uintptr_t x, std::uintptr_t dy, std::uintptr_t dw,
                                           std::uintptr_t ws, std::size_t ws_bytes) {
        int n = 0;
        CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h.get(), &n));
        std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> r(std::max(n, 1));
        int got = 0;
        set_math(-1);
        {
            py::gil_scoped_release nogil;
            CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h.get(), x_, ptr<void>(x), y_, ptr<void>(dy), conv_,
                                                                w_, ptr<void>(dw), static_cast<int>(r.size()), &got,
                                                                r.data(), ptr<void>(ws), ws_bytes));
        }
        return perfs(r, got);
    }

    // The passes, queued on the handle's stream: out = alpha * conv + beta * out, with math type
    // ``math`` (the one Find timed the algorithm with; -1: the descriptor's own).
    void forward(const Handle& h, std::uintptr_t x, std::uintptr_t w, std::uintptr_t y, int algo, std::uintptr_t ws,
                 std::size_t ws_bytes, double alpha, double beta, int math) {
        Scalars s(double_, alpha, beta);
        set_math(math);
        CHECK(cudnnConvolutionForward(h.get(), s.alpha(), x_, ptr<void>(x), w_, ptr<void>(w), conv_,
                                      static_cast<cudnnConvolutionFwdAlgo_t>(algo), ptr<void>(ws), ws_bytes,
                                      s.beta(), y_, ptr<void>(y)));
    }
    void backward_data(const Handle& h, std::uintptr_t w, std::uintptr_t dy, std::uintptr_t dx, int algo,
                       std::uintptr_t ws, std::size_t ws_bytes, double alpha, double beta, int math) {
        Scalars s(double_, alpha, beta);
        set_math(math);
        CHECK(cudnnConvolutionBackwardData(h.get(), s.alpha(), w_, ptr<void>(w), y_, ptr<void>(dy), conv_,
                                           static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), ptr<void>(ws), ws_bytes,
                                           s.beta(), x_, ptr<void>(dx)));
    }
    void backward_filter(const Handle& h, std::uintptr_t x, std::uintptr_t dy, std::uintptr_t dw, int algo,
                         std::uintptr_t ws, std::size_t ws_bytes, double alpha, double beta, int math) {
        Scalars s(double_, alpha, beta);
        set_math(math);
        CHECK(cudnnConvolutionBackwardFilter(h.get(), s.alpha(), x_, ptr<void>(x), y_, ptr<void>(dy), conv_,
                                             static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), ptr<void>(ws),
                                             ws_bytes, s.beta(), w_, ptr<void>(dw)));
    }

  private:
    // cuDNN reads alpha and beta as double for double data, float otherwise (16-bit data too).
    struct Scalars {
        bool dbl;
        double d[2];
        float f[2];
        Scalars(bool is_double, double a, double b)
            : dbl(is_double), d{a, b}, f{static_cast<float>(a), static_cast<float>(b)} {}
        const void* alpha() const { return dbl ? static_cast<const void*>(&d[0]) : &f[0]; }
        const void* beta() const { return dbl ? static_cast<const void*>(&d[1]) : &f[1]; }
    };

    // The descriptor is the convolution's for every call, so each call sets the math type it runs
    // with (the call before may have set another).
    void set_math(int math) {
        const cudnnMathType_t m = math < 0 ? default_math_ : static_cast<cudnnMathType_t>(math);
        if (m != math_) {
            CHECK(cudnnSetConvolutionMathType(conv_, m));
            math_ = m;
        }
    }
    template <typename P>
    static std::vector<Perf> perfs(const std::vector<P>& r, int got) {
        std::vector<Perf> out;
        for (int i = 0; i < got; ++i) out.push_back(perf(r[i]));
        return out;
    }
    void destroy() {
        if (x_) cudnnDestroyTensorDescriptor(x_);
        if (y_) cudnnDestroyTensorDescriptor(y_);
        if (w_) cudnnDestroyFilterDescriptor(w_);
        if (conv_) cudnnDestroyConvolutionDescriptor(conv_);
        x_ = y_ = nullptr;
        w_ = nullptr;
        conv_ = nullptr;
    }

    bool double_;
    cudnnMathType_t default_math_, math_ = CUDNN_DEFAULT_MATH;
    cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr;
    cudnnFilterDescriptor_t w_ = nullptr;
    cudnnConvolutionDescriptor_t conv_ = nullptr;
    std::vector<int> out_;
};

}  // namespace

PYBIND11_MODULE(_cudnn, m) {
    m.doc() =
        "minidnn's binding of cuDNN convolutions. Device pointers and cudaStream_t handles are\n"
        "integers (CuPy's MemoryPointer.ptr, Stream.ptr); nothing here allocates device memory.\n"
        "Failures raise CudnnError with cuDNN's status string.";

    // The exception type lives as long as the interpreter (its reference is deliberately kept).
    static py::handle error = py::exception<CudnnFailure>(m, "CudnnError", PyExc_RuntimeError).release();
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const CudnnFailure& e) {
            py::object exc = error(e.what());
            exc.attr("status") = e.status;
            PyErr_SetObject(error.ptr(), exc.ptr());
        }
    });

    m.def("version", []() { return static_cast<long>(cudnnGetVersion()); },
          "The cuDNN library's version number (e.g. 91400 for 9.14.0), read from the loaded library.");
    m.def("header_version", []() { return static_cast<long>(CUDNN_VERSION); },
          "The cuDNN version of the headers this module was built against.");
    m.def("cudart_version", []() { return static_cast<long>(cudnnGetCudartVersion()); },
          "The CUDA runtime version the loaded cuDNN library was built for.");
    m.def("error_string", [](int status) { return std::string(cudnnGetErrorString(static_cast<cudnnStatus_t>(status))); },
          "status"_a, "cuDNN's name of a cudnnStatus_t value.");
    m.def("check_status", [](int status, const std::string& what) { check(static_cast<cudnnStatus_t>(status), what.c_str()); },
          "status"_a, "what"_a, "Raise CudnnError for a failing status, as every call of this module does.");
    m.def("is_not_supported", &not_supported, "status"_a,
          "Whether a status means \"not supported for this layer\" (cuDNN 9: the category and its sub-codes).");
    m.def("workspace_result", [](int status, std::size_t bytes) { return ws_or_none(status, bytes, "a workspace query"); },
          "status"_a, "bytes"_a,
          "What a workspace query returns for a status: bytes, None where not supported, else CudnnError.");
    m.attr("FWD_ALGOS") = kFwdNames;
    m.attr("BWD_DATA_ALGOS") = kBwdDataNames;
    m.attr("BWD_FILTER_ALGOS") = kBwdFilterNames;
    m.attr("STATUS_SUCCESS") = static_cast<int>(CUDNN_STATUS_SUCCESS);
    m.attr("STATUS_NOT_SUPPORTED") = static_cast<int>(CUDNN_STATUS_NOT_SUPPORTED);
    m.attr("STATUS_BAD_PARAM") = static_cast<int>(CUDNN_STATUS_BAD_PARAM);
    m.attr("DATA_FLOAT") = static_cast<int>(CUDNN_DATA_FLOAT);
    m.attr("DATA_DOUBLE") = static_cast<int>(CUDNN_DATA_DOUBLE);
    m.attr("DATA_HALF") = static_cast<int>(CUDNN_DATA_HALF);
#if CUDNN_VERSION >= 8100
    m.attr("DATA_BFLOAT16") = static_cast<int>(CUDNN_DATA_BFLOAT16);
#endif
    m.attr("DEFAULT_MATH") = static_cast<int>(CUDNN_DEFAULT_MATH);
    m.attr("TENSOR_OP_MATH") = static_cast<int>(CUDNN_TENSOR_OP_MATH);
    m.attr("FMA_MATH") = static_cast<int>(CUDNN_FMA_MATH);

    py::class_<Handle>(m, "Handle", "A cuDNN handle whose work is queued on one stream (0: the default stream).")
        .def(py::init<std::uintptr_t>(), "stream"_a = 0)
        .def("set_stream", &Handle::set_stream, "stream"_a)
        .def_property_readonly("stream", &Handle::stream)
        .def("close", &Handle::close, "Destroy the handle now (also done when it is collected).");

    py::class_<Conv>(m, "Conv",
                     "Descriptors of one NCHW convolution (dtype: float32, float64, float16 or bfloat16; 16-bit\n"
                     "data accumulates in float on tensor cores). Perf tuples are (algo, status, seconds or -1,\n"
                     "workspace bytes, deterministic, uses tensor ops, math type).")
        .def(py::init<int, int, int, int, int, int, int, int, int, int, int, int, int, int, const std::string&, bool>(),
             "n"_a, "c"_a, "h"_a, "w"_a, "o"_a, "kh"_a, "kw"_a, "sh"_a, "sw"_a, "ph"_a, "pw"_a, "dh"_a, "dw"_a,
             "groups"_a, "dtype"_a, "allow_tensor_ops"_a = false)
        .def_property_readonly("output_shape", &Conv::output_shape)
        .def_property_readonly("types", &Conv::types,
                               "(x, filter, y, compute) cudnnDataType_t and the default cudnnMathType_t, as set")
        .def("forward_workspace", &Conv::forward_workspace, "handle"_a, "algo"_a, "math"_a = -1)
        .def("backward_data_workspace", &Conv::backward_data_workspace, "handle"_a, "algo"_a, "math"_a = -1)
        .def("backward_filter_workspace", &Conv::backward_filter_workspace, "handle"_a, "algo"_a, "math"_a = -1)
        .def("forward_heuristics", &Conv::forward_heuristics, "handle"_a)
        .def("backward_data_heuristics", &Conv::backward_data_heuristics, "handle"_a)
        .def("backward_filter_heuristics", &Conv::backward_filter_heuristics, "handle"_a)
        .def("find_forward", &Conv::find_forward, "handle"_a, "x"_a, "w"_a, "y"_a, "ws"_a, "ws_bytes"_a)
        .def("find_backward_data", &Conv::find_backward_data, "handle"_a, "w"_a, "dy"_a, "dx"_a, "ws"_a,
             "ws_bytes"_a)
        .def("find_backward_filter", &Conv::find_backward_filter, "handle"_a, "x"_a, "dy"_a, "dw"_a, "ws"_a,
             "ws_bytes"_a)
        .def("forward", &Conv::forward, "handle"_a, "x"_a, "w"_a, "y"_a, "algo"_a, "ws"_a, "ws_bytes"_a,
             "alpha"_a = 1.0, "beta"_a = 0.0, "math"_a = -1)
        .def("backward_data", &Conv::backward_data, "handle"_a, "w"_a, "dy"_a, "dx"_a, "algo"_a, "ws"_a,
             "ws_bytes"_a, "alpha"_a = 1.0, "beta"_a = 0.0, "math"_a = -1)
        .def("backward_filter", &Conv::backward_filter, "handle"_a, "x"_a, "dy"_a, "dw"_a, "algo"_a, "ws"_a,
             "ws_bytes"_a, "alpha"_a = 1.0, "beta"_a = 0.0, "math"_a = -1);
}
