// Python bindings of the minidnn CPU kernels (module minidnn._C).
//
// Conventions shared by every kernel:
//  * arrays are numpy.ndarray of dtype float32 or float64, all arrays of one
//    call share one dtype; they must be C-contiguous and aligned; nothing is
//    ever converted or copied (TypeError for a wrong type/dtype, ValueError for
//    a wrong layout or shape, the message names the argument);
//  * outputs are never allocated: the kernel writes into the arrays it is
//    handed (and overwrites them unless stated otherwise);
//  * the GIL is released during the computation, which is parallelised with
//    OpenMP and bitwise deterministic whatever the number of threads.
#include "kernels.h"

namespace py = pybind11;
using namespace pybind11::literals;
using minidnn::index_t;

#define WINDOW_ARGS "kh"_a, "kw"_a, "sh"_a, "sw"_a, "ph"_a, "pw"_a, "dh"_a, "dw"_a

PYBIND11_MODULE(_C, m) {
    // Each docstring starts with its own Python signature line.
    py::options options;
    options.disable_function_signatures();
    m.doc() =
        "minidnn CPU kernels (C++/OpenMP).\n\n"
        "All array arguments are numpy.ndarray of one common dtype (float32 or float64),\n"
        "C-contiguous and aligned; they are never copied or converted (TypeError for a\n"
        "wrong type or dtype, ValueError for a wrong layout or shape). Outputs are never\n"
        "allocated: results are written into the given arrays. Kernels release the GIL,\n"
        "run in parallel with OpenMP and are bitwise deterministic for any thread count.\n"
        "Window sizes follow PyTorch: OH = (H + 2*ph - dh*(kh-1) - 1) // sh + 1.";

    m.def("im2col", &minidnn::im2col, "x"_a, "cols"_a, WINDOW_ARGS,
          "im2col(x, cols, kh, kw, sh, sw, ph, pw, dh, dw) -> None\n\n"
          "Unfold x (N, C, H, W) into cols (C*kh*kw, N*OH*OW) with the batch folded\n"
          "into the columns: cols[(c*kh + i)*kw + j, n*OH*OW + oh*OW + ow] =\n"
          "x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw] (0 outside the image).\n"
          "W(O, C*kh*kw) @ cols then gives the convolution output (O, N*OH*OW).");

    m.def("col2im", &minidnn::col2im, "cols"_a, "x"_a, WINDOW_ARGS,
          "col2im(cols, x, kh, kw, sh, sw, ph, pw, dh, dw) -> None\n\n"
          "Adjoint of im2col: OVERWRITES x (N, C, H, W) with the sum of every entry of\n"
          "cols (C*kh*kw, N*OH*OW) that im2col would read from each pixel (entries\n"
          "that fall in the padding are dropped). Deterministic: each (n, c) plane is\n"
          "accumulated by one thread in a fixed order.");

    m.def("nchw_to_cn", &minidnn::nchw_to_cn, "x"_a, "out"_a,
          "nchw_to_cn(x, out) -> None\n\n"
          "x (N, C, *spatial) with L = prod(spatial) (e.g. (N, C, H, W) or (N, C, L))\n"
          "-> out (C, N*L): out[c, n*L + l] = x[n, c, l].");

    m.def("cn_to_nchw", &minidnn::cn_to_nchw, "src"_a, "out"_a, "accumulate"_a = false,
          "cn_to_nchw(src, out, accumulate=False) -> None\n\n"
          "src (C, N*L) -> out (N, C, *spatial) with L = prod(spatial):\n"
          "out[n, c, l] = src[c, n*L + l], or out[n, c, l] += src[c, n*L + l] when\n"
          "accumulate is True.");

    m.def("maxpool2d_forward", &minidnn::maxpool2d_forward, "x"_a, "y"_a, WINDOW_ARGS,
          "maxpool2d_forward(x, y, kh, kw, sh, sw, ph, pw, dh, dw) -> None\n\n"
          "Max pooling of x (N, C, H, W) into y (N, C, OH, OW), PyTorch MaxPool2d\n"
          "semantics (padding is -inf, ceil_mode=False, padding <= kernel/2).");

    m.def("maxpool2d_backward", &minidnn::maxpool2d_backward, "x"_a, "gy"_a, "gx"_a,
          WINDOW_ARGS,
          "maxpool2d_backward(x, gy, gx, kh, kw, sh, sw, ph, pw, dh, dw) -> None\n\n"
          "OVERWRITES gx (N, C, H, W) with the gradient of max pooling given gy\n"
          "(N, C, OH, OW). The argmax is recomputed from x (no index buffer): the first\n"
          "maximum in row-major window order wins (a later element replaces it only if\n"
          "strictly greater, or NaN), as in PyTorch.");

    m.def("avgpool2d_forward", &minidnn::avgpool2d_forward, "x"_a, "y"_a, "kh"_a, "kw"_a,
          "sh"_a, "sw"_a, "ph"_a, "pw"_a, "count_include_pad"_a,
          "avgpool2d_forward(x, y, kh, kw, sh, sw, ph, pw, count_include_pad) -> None\n\n"
          "Average pooling of x (N, C, H, W) into y (N, C, OH, OW), PyTorch AvgPool2d\n"
          "semantics (ceil_mode=False, padding <= kernel/2, no divisor override).");

    m.def("avgpool2d_backward", &minidnn::avgpool2d_backward, "gy"_a, "gx"_a, "kh"_a,
          "kw"_a, "sh"_a, "sw"_a, "ph"_a, "pw"_a, "count_include_pad"_a,
          "avgpool2d_backward(gy, gx, kh, kw, sh, sw, ph, pw, count_include_pad) -> None\n\n"
          "OVERWRITES gx (N, C, H, W) with the gradient of average pooling given gy\n"
          "(N, C, OH, OW).");

    m.def("adaptive_avgpool2d_forward", &minidnn::adaptive_avgpool2d_forward, "x"_a, "y"_a,
          "adaptive_avgpool2d_forward(x, y) -> None\n\n"
          "Adaptive average pooling of x (N, C, H, W) into y (N, C, OH, OW), PyTorch\n"
          "AdaptiveAvgPool2d: y[oh, ow] is the mean of rows [floor(oh*H/OH),\n"
          "ceil((oh+1)*H/OH)) and columns [floor(ow*W/OW), ceil((ow+1)*W/OW)).");

    m.def("adaptive_avgpool2d_backward", &minidnn::adaptive_avgpool2d_backward, "gy"_a, "gx"_a,
          "adaptive_avgpool2d_backward(gy, gx) -> None\n\n"
          "OVERWRITES gx (N, C, H, W) with the gradient of adaptive average pooling\n"
          "given gy (N, C, OH, OW).");

    m.def("adaptive_maxpool2d_forward", &minidnn::adaptive_maxpool2d_forward, "x"_a, "y"_a,
          "adaptive_maxpool2d_forward(x, y) -> None\n\n"
          "Adaptive max pooling of x (N, C, H, W) into y (N, C, OH, OW) over the windows\n"
          "of adaptive_avgpool2d_forward, PyTorch AdaptiveMaxPool2d.");

    m.def("adaptive_maxpool2d_backward", &minidnn::adaptive_maxpool2d_backward, "x"_a, "gy"_a,
          "gx"_a,
          "adaptive_maxpool2d_backward(x, gy, gx) -> None\n\n"
          "OVERWRITES gx (N, C, H, W) with the gradient of adaptive max pooling given gy\n"
          "(N, C, OH, OW). The argmax is recomputed from x (no index buffer): the first\n"
          "maximum in row-major window order wins (a later element replaces it only if\n"
          "strictly greater, or NaN), as in PyTorch.");

    m.def("bn_stats", &minidnn::bn_stats, "x"_a, "mean"_a, "var"_a,
          "bn_stats(x, mean, var) -> None\n\n"
          "Per-channel mean and biased variance of x (N, C, *spatial) written into mean\n"
          "(C,) and var (C,). Two passes (mean, then sum of squared deviations) with\n"
          "float64 accumulation; parallel over channels.");

    m.def("bn_forward_train", &minidnn::bn_forward_train, "x"_a, "gamma"_a, "beta"_a,
          "mean"_a, "invstd"_a, "y"_a, "relu"_a = false, "residual"_a = py::none(),
          "bn_forward_train(x, gamma, beta, mean, invstd, y, relu=False, residual=None) -> None\n\n"
          "y = (x - mean[c]) * invstd[c] * gamma[c] + beta[c] for x, y (N, C, *spatial)\n"
          "and per-channel vectors (C,), evaluated as x*alpha + shift with alpha and\n"
          "shift computed in float64. gamma / beta may be None (1 / 0). y may be x.\n"
          "With residual (x's shape), y = that + residual as add gives it; with relu, y =\n"
          "relu(that), bitwise what relu_forward gives of it.");

    m.def("bn_backward", &minidnn::bn_backward, "x"_a, "gy"_a, "gamma"_a, "mean"_a,
          "invstd"_a, "gx"_a, "ggamma"_a = py::none(), "gbeta"_a = py::none(),
          "bn_backward(x, gy, gamma, mean, invstd, gx, ggamma=None, gbeta=None) -> None\n\n"
          "Training-mode batch-norm backward (biased variance), M = N*prod(spatial):\n"
          "  gbeta[c]  = sum(gy),  ggamma[c] = sum(gy * xhat),  xhat = (x-mean)*invstd\n"
          "  gx = gamma*invstd/M * (M*gy - gbeta - xhat*ggamma)\n"
          "gx, ggamma, gbeta are OVERWRITTEN; ggamma / gbeta may be None (not written),\n"
          "gamma may be None (1). Reductions in float64, one thread per channel.");

    m.def("relu_forward", &minidnn::relu_forward, "x"_a, "y"_a,
          "relu_forward(x, y) -> None\n\n"
          "OVERWRITES y with max(x, 0) (NaN stays NaN); y may be x.");
    m.def("add", &minidnn::add, "a"_a, "b"_a, "out"_a,
          "add(a, b, out) -> None\n\n"
          "OVERWRITES out with a + b, or with a copy of a where b is None; out may be a or b.");
    m.def("relu_backward", &minidnn::relu_backward, "y"_a, "gy"_a, "gx"_a,
          "relu_backward(y, gy, gx) -> None\n\n"
          "gx = gy where y > 0 else 0 (y is the ReLU output). Arrays of any shape with\n"
          "the same number of elements; gx may be gy.");

    m.def("sgd_update", &minidnn::sgd_update, "p"_a, "g"_a, "buf"_a, "lr"_a, "momentum"_a,
          "dampening"_a, "weight_decay"_a, "nesterov"_a, "first"_a,
          "sgd_update(p, g, buf, lr, momentum, dampening, weight_decay, nesterov, first) -> None\n\n"
          "One SGD step of p in place from g (PyTorch's rule and order of operations), in one pass;\n"
          "buf (the momentum buffer, None without momentum) is updated too, or set on the first step.");

    m.def("add_inplace", &minidnn::add_inplace, "dst"_a, "src"_a,
          "add_inplace(dst, src) -> None\n\n"
          "dst += src elementwise (any shapes with the same number of elements).");

    m.def("place_buffers", &minidnn::place_buffers, "starts"_a, "ends"_a, "sizes"_a, "order"_a, "base"_a = 0,
          "place_buffers(starts, ends, sizes, order, base=0) -> offsets\n\n"
          "Arena offsets (>= base) for buffers alive over steps [starts[i], ends[i]] of\n"
          "sizes[i] bytes (1-D int64 arrays), placed in the order ``order`` (a permutation\n"
          "of their indices), each in the lowest gap between overlapping placed buffers\n"
          "that holds it. No two buffers alive at a common step share a byte.");
    m.def("place_buffers_lowest", &minidnn::place_buffers_lowest, "starts"_a, "ends"_a, "sizes"_a, "order"_a,
          "base"_a = 0,
          "place_buffers_lowest(starts, ends, sizes, order, base=0) -> offsets\n\n"
          "place_buffers' offsets, with the buffers placed lowest first: next, always the one whose\n"
          "lowest gap is lowest (on a tie, the one earlier in ``order``).");

#define CONV_ARGS "sh"_a, "sw"_a, "ph"_a, "pw"_a, "dh"_a, "dw"_a, "groups"_a = 1
    m.def("conv2d_direct_forward", &minidnn::conv2d_direct_forward, "x"_a, "w"_a, "b"_a, "y"_a,
          CONV_ARGS,
          "conv2d_direct_forward(x, w, b, y, sh, sw, ph, pw, dh, dw, groups=1) -> None\n\n"
          "Direct convolution with no workspace: OVERWRITES y (N, O, OH, OW) with the\n"
          "convolution of x (N, C, H, W) by w (O, C/groups, kh, kw) plus b (O,) (b may be\n"
          "None). Kernels up to 32x32; parallel over (sample, output row, channel block).");

    m.def("conv2d_direct_backward_data", &minidnn::conv2d_direct_backward_data, "gy"_a, "w"_a,
          "gx"_a, CONV_ARGS,
          "conv2d_direct_backward_data(gy, w, gx, sh, sw, ph, pw, dh, dw, groups=1) -> None\n\n"
          "OVERWRITES gx (N, C, H, W) with the gradient of the convolution with respect to\n"
          "its input, given gy (N, O, OH, OW) and w (O, C/groups, kh, kw); no workspace.\n"
          "Also the forward of the transposed convolution (gx may be larger than the\n"
          "convolution of gy needs, as with output_padding).");

    m.def("conv2d_direct_backward_filter", &minidnn::conv2d_direct_backward_filter, "x"_a, "gy"_a,
          "gw"_a, CONV_ARGS,
          "conv2d_direct_backward_filter(x, gy, gw, sh, sw, ph, pw, dh, dw, groups=1) -> None\n\n"
          "OVERWRITES gw (O, C/groups, kh, kw) with the gradient of the convolution with\n"
          "respect to its filter, given x (N, C, H, W) and gy (N, O, OH, OW); no workspace.\n"
          "Each gw entry is summed by one thread in a fixed order.");

    m.def("conv2d_bias_grad", &minidnn::conv2d_bias_grad, "gy"_a, "gb"_a,
          "conv2d_bias_grad(gy, gb) -> None\n\n"
          "OVERWRITES gb (C,) with the sum of gy (N, C, *spatial) over every axis but 1\n"
          "(float64 accumulation, fixed order).");

    m.def("conv2d_add_bias", &minidnn::conv2d_add_bias, "y"_a, "b"_a,
          "conv2d_add_bias(y, b) -> None\n\n"
          "y[:, c] += b[c] for y (N, C, *spatial) and b (C,), in place.");

    m.def("conv2d_implicit_available", &minidnn::conv2d_implicit_available,
          "conv2d_implicit_available() -> bool\n\nWhether this CPU runs the implicit convolution "
          "(AVX-512F).");
    m.def("conv2d_implicit_workspace", &minidnn::conv2d_implicit_workspace, "N"_a, "C"_a, "H"_a, "W"_a,
          "O"_a, "kh"_a, "kw"_a, "sh"_a, "sw"_a, "ph"_a, "pw"_a, "dh"_a, "dw"_a, "groups"_a, "role"_a,
          "conv2d_implicit_workspace(N, C, H, W, O, kh, kw, sh, sw, ph, pw, dh, dw, groups, role) -> int\n\n"
          "Floats of workspace the implicit convolution of x (N, C, H, W) into O channels needs\n"
          "for role 0 (forward), 1 (backward-data) or 2 (backward-filter).");
    m.def("conv2d_implicit_forward", &minidnn::conv2d_implicit_forward, "x"_a, "w"_a, "b"_a, "y"_a,
          "ws"_a, CONV_ARGS,
          "conv2d_implicit_forward(x, w, b, y, ws, sh, sw, ph, pw, dh, dw, groups=1) -> None\n\n"
          "Convolution as an implicit GEMM over a zero-padded copy of x in ws, split into stride\n"
          "phases (float32, AVX-512): OVERWRITES y (N, O, OH, OW) with x (N, C, H, W) convolved\n"
          "by w (O, C/groups, kh, kw), plus b (O,) unless None.");
    m.def("conv2d_implicit_backward_data", &minidnn::conv2d_implicit_backward_data, "gy"_a, "w"_a,
          "gx"_a, "ws"_a, CONV_ARGS,
          "conv2d_implicit_backward_data(gy, w, gx, ws, sh, sw, ph, pw, dh, dw, groups=1) -> None\n\n"
          "OVERWRITES gx (N, C, H, W) with the convolution's input gradient given gy; stride 1\n"
          "and padding <= dilation * (kernel - 1) only.");
    m.def("conv2d_implicit_backward_filter", &minidnn::conv2d_implicit_backward_filter, "x"_a, "gy"_a,
          "gw"_a, "ws"_a, CONV_ARGS,
          "conv2d_implicit_backward_filter(x, gy, gw, ws, sh, sw, ph, pw, dh, dw, groups=1) -> None\n\n"
          "OVERWRITES gw (O, C/groups, kh, kw) with the convolution's filter gradient.");

    // Winograd F(mxm, 3x3): a = m + 2 points per tile side, tiles TH = ceil(OH/m), TW = ceil(OW/m).
    m.def("winograd_filter_transform", &minidnn::winograd_filter_transform, "w"_a, "U"_a,
          "flip"_a = false, "m"_a = 2,
          "winograd_filter_transform(w, U, flip=False, m=2) -> None\n\n"
          "Winograd F(mxm,3x3) filter transform G g G^T of w (O, C, 3, 3) into U (a*a, O, C);\n"
          "with flip, of each filter turned by 180 degrees (the backward-data pass's, whose\n"
          "transpose U[t].T its GEMM reads); a = m + 2.");

    m.def("winograd_input_transform", &minidnn::winograd_input_transform, "x"_a, "V"_a, "ph"_a,
          "pw"_a, "m"_a = 2,
          "winograd_input_transform(x, V, ph, pw, m=2) -> None\n\n"
          "Winograd F(mxm,3x3) input transform B^T d B of the a x a tiles of x (N, C, H, W)\n"
          "padded by (ph, pw) into V (a*a, C, N*TH*TW), TH = ceil(OH/m), OH = H + 2*ph - 2.");

    m.def("winograd_output_transform", &minidnn::winograd_output_transform, "M"_a, "y"_a,
          "b"_a = py::none(), "m"_a = 2,
          "winograd_output_transform(M, y, b=None, m=2) -> None\n\n"
          "Winograd F(mxm,3x3) output transform A^T m A of M (a*a, O, N*TH*TW) into y\n"
          "(N, O, OH, OW), OVERWRITTEN, plus b (O,) when given.");

    m.def("winograd_gradient_transform", &minidnn::winograd_gradient_transform, "gy"_a, "Z"_a,
          "m"_a = 2,
          "winograd_gradient_transform(gy, Z, m=2) -> None\n\n"
          "Winograd F(mxm,3x3) transform A g A^T of the m x m tiles of gy (N, O, OH, OW), zero\n"
          "past its edges, into Z (a*a, O, N*TH*TW): the filter gradient's D[t] = Z[t] V[t]^T.");

    m.def("winograd_filter_gradient", &minidnn::winograd_filter_gradient, "D"_a, "gw"_a, "m"_a = 2,
          "winograd_filter_gradient(D, gw, m=2) -> None\n\n"
          "Winograd F(mxm,3x3) filter-gradient transform G^T d G of D (a*a, O, C) into gw\n"
          "(O, C, 3, 3), OVERWRITTEN.");

    m.def("get_num_threads", &minidnn::get_num_threads,
          "get_num_threads() -> int\n\nNumber of OpenMP threads the kernels use (1 without "
          "OpenMP).");
    m.def("set_num_threads", &minidnn::set_num_threads, "n"_a,
          "set_num_threads(n) -> None\n\nSet the number of OpenMP threads used by kernels "
          "called from the current thread (no effect without OpenMP).");

#ifdef _OPENMP
    m.attr("has_openmp") = true;
#else
    m.attr("has_openmp") = false;
#endif
}
