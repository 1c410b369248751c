"""Ops: stateless math with forward and backward side by side (see base.py)."""
from .activation import gelu, leaky_relu, relu, sigmoid, silu, tanh
from .base import Op, apply
from .conv import conv2d, conv_transpose2d
from .dropout import dropout
from .elementwise import add, cat, flatten, reshape, scalar_affine
from .interpolate import interpolate
from .linear import linear
from .loss import cross_entropy, mse_loss
from .norm import batch_norm1d, batch_norm2d
from .pool import adaptive_avg_pool2d, adaptive_max_pool2d, avg_pool2d, max_pool2d
from .sample_norm import group_norm, layer_norm

__all__ = ["Op", "apply", "relu", "leaky_relu", "sigmoid", "tanh", "gelu", "silu", "conv2d", "conv_transpose2d",
           "dropout", "add", "cat", "flatten", "reshape", "scalar_affine", "linear", "cross_entropy", "mse_loss",
           "batch_norm1d", "batch_norm2d", "layer_norm", "group_norm", "interpolate", "max_pool2d", "avg_pool2d",
           "adaptive_avg_pool2d", "adaptive_max_pool2d"]
