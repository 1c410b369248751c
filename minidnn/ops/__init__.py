"""Ops: stateless math with forward and backward side by side (see base.py)."""
from .activation import leaky_relu, relu, sigmoid, tanh
from .base import Op, apply
from .conv import conv2d, conv_transpose2d
from .dropout import dropout
from .elementwise import add, cat, flatten, reshape, scalar_affine
from .linear import linear
from .loss import cross_entropy, mse_loss
from .norm import batch_norm2d
from .pool import adaptive_avg_pool2d, adaptive_max_pool2d, avg_pool2d, max_pool2d

__all__ = ["Op", "apply", "relu", "leaky_relu", "sigmoid", "tanh", "conv2d", "conv_transpose2d",
           "dropout", "add", "cat", "flatten", "reshape", "scalar_affine", "linear", "cross_entropy", "mse_loss",
           "batch_norm2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
           "adaptive_max_pool2d"]
