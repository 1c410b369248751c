"""Functional forms of the ops, for use inside ``forward``."""
from ..ops import (adaptive_avg_pool2d, adaptive_max_pool2d, add, avg_pool2d, batch_norm2d, cat,  # noqa: F401
                   conv2d, conv_transpose2d, cross_entropy, dropout, flatten, leaky_relu, linear, max_pool2d,
                   mse_loss, relu, reshape, scalar_affine, sigmoid, tanh)
