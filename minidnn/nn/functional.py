"""Functional forms of the ops, for use inside ``forward``."""
from ..ops import (adaptive_avg_pool2d, adaptive_max_pool2d, add, avg_pool2d, batch_norm1d, batch_norm2d,  # noqa: F401
                   cat, conv2d, conv_transpose2d, cross_entropy, dropout, flatten, gelu, group_norm, interpolate,
                   layer_norm, leaky_relu, linear, max_pool2d, mse_loss, relu, reshape, scalar_affine, sigmoid,
                   silu, tanh)
