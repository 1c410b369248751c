// Declarations of the Python-facing kernels of minidnn._C.
// All functions validate their arguments (see common.h), never allocate output
// arrays, release the GIL around the compute loops and are deterministic
// (bitwise identical results whatever the number of threads).
#pragma once

#include "common.h"

namespace minidnn {

// im2col.cpp ---------------------------------------------------------------
void im2col(py::object x, py::object cols, index_t kh, index_t kw, index_t sh,
            index_t sw, index_t ph, index_t pw, index_t dh, index_t dw);
void col2im(py::object cols, py::object x, index_t kh, index_t kw, index_t sh,
            index_t sw, index_t ph, index_t pw, index_t dh, index_t dw);
void nchw_to_cn(py::object x, py::object out);
void cn_to_nchw(py::object src, py::object out, bool accumulate);

// pool.cpp -----------------------------------------------------------------
void maxpool2d_forward(py::object x, py::object y, index_t kh, index_t kw,
                       index_t sh, index_t sw, index_t ph, index_t pw,
                       index_t dh, index_t dw);
void maxpool2d_backward(py::object x, py::object gy, py::object gx, index_t kh,
                        index_t kw, index_t sh, index_t sw, index_t ph,
                        index_t pw, index_t dh, index_t dw);
void avgpool2d_forward(py::object x, py::object y, index_t kh, index_t kw,
                       index_t sh, index_t sw, index_t ph, index_t pw,
                       bool count_include_pad);
void avgpool2d_backward(py::object gy, py::object gx, index_t kh, index_t kw,
                        index_t sh, index_t sw, index_t ph, index_t pw,
                        bool count_include_pad);

// adaptive_pool.cpp --------------------------------------------------------
void adaptive_avgpool2d_forward(py::object x, py::object y);
void adaptive_avgpool2d_backward(py::object gy, py::object gx);
void adaptive_maxpool2d_forward(py::object x, py::object y);
void adaptive_maxpool2d_backward(py::object x, py::object gy, py::object gx);

// batchnorm.cpp ------------------------------------------------------------
void bn_stats(py::object x, py::object mean, py::object var);
void bn_forward_train(py::object x, py::object gamma, py::object beta,
                      py::object mean, py::object invstd, py::object y, bool relu,
                      py::object residual);
void bn_backward(py::object x, py::object gy, py::object gamma, py::object mean,
                 py::object invstd, py::object gx, py::object ggamma,
                 py::object gbeta);

// elementwise.cpp ----------------------------------------------------------
void relu_forward(py::object x, py::object y);
void add(py::object a, py::object b, py::object out);
void relu_backward(py::object y, py::object gy, py::object gx);
void add_inplace(py::object dst, py::object src);
void sgd_update(py::object p, py::object g, py::object buf, double lr, double momentum,
                double dampening, double weight_decay, bool nesterov, bool first);

// placement.cpp ------------------------------------------------------------
py::array_t<int64_t> place_buffers(py::object starts, py::object ends, py::object sizes, py::object order,
                                   int64_t base);
py::array_t<int64_t> place_buffers_lowest(py::object starts, py::object ends, py::object sizes, py::object order,
                                   int64_t base);

// conv_direct.cpp ----------------------------------------------------------
void conv2d_direct_forward(py::object x, py::object w, py::object b, py::object y, index_t sh,
                           index_t sw, index_t ph, index_t pw, index_t dh, index_t dw,
                           index_t groups);
void conv2d_direct_backward_data(py::object gy, py::object w, py::object gx, index_t sh,
                                 index_t sw, index_t ph, index_t pw, index_t dh, index_t dw,
                                 index_t groups);
void conv2d_direct_backward_filter(py::object x, py::object gy, py::object gw, index_t sh,
                                   index_t sw, index_t ph, index_t pw, index_t dh, index_t dw,
                                   index_t groups);
void conv2d_bias_grad(py::object gy, py::object gb);
void conv2d_add_bias(py::object y, py::object b);

// conv_implicit.cpp --------------------------------------------------------
bool conv2d_implicit_available();
// Floats of workspace of a pass: role 0 forward, 1 backward-data, 2 backward-filter.
index_t conv2d_implicit_workspace(index_t N, index_t C, index_t H, index_t W, index_t O, index_t kh,
                                  index_t kw, index_t sh, index_t sw, index_t ph, index_t pw, index_t dh,
                                  index_t dw, index_t groups, int role);
void conv2d_implicit_forward(py::object x, py::object w, py::object b, py::object y, py::object ws,
                             index_t sh, index_t sw, index_t ph, index_t pw, index_t dh, index_t dw,
                             index_t groups);
void conv2d_implicit_backward_data(py::object gy, py::object w, py::object gx, py::object ws, index_t sh,
                                   index_t sw, index_t ph, index_t pw, index_t dh, index_t dw, index_t groups);
void conv2d_implicit_backward_filter(py::object x, py::object gy, py::object gw, py::object ws, index_t sh,
                                     index_t sw, index_t ph, index_t pw, index_t dh, index_t dw, index_t groups);

// winograd.cpp -------------------------------------------------------------
void winograd_filter_transform(py::object w, py::object u, bool flip, index_t m);
void winograd_input_transform(py::object x, py::object v, index_t ph, index_t pw, index_t m);
void winograd_output_transform(py::object mo, py::object y, py::object b, index_t m);
void winograd_gradient_transform(py::object gy, py::object z, index_t m);
void winograd_filter_gradient(py::object d, py::object gw, index_t m);

}  // namespace minidnn
