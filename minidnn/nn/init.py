"""PyTorch's default initializations, drawn from an explicit NumPy Generator."""
from __future__ import annotations

import math

import numpy as np


def fan_in(shape, transposed=False):
    """Fan-in as PyTorch computes it: dim 1 times the receptive field."""
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive


def uniform(rng, shape, bound, dtype=np.float32):
    """U(-bound, bound), drawn directly in ``dtype`` (no float64 temporary for large layers)."""
    out = rng.random(shape, dtype=np.float32).astype(dtype, copy=False)
    out *= 2 * bound
    out -= bound
    return out


def kaiming_uniform(rng, shape, a=math.sqrt(5), dtype=np.float32):
    """``torch.nn.init.kaiming_uniform_`` with leaky-ReLU gain (the layer default a=sqrt(5))."""
    gain = math.sqrt(2.0 / (1 + a * a))
    return uniform(rng, shape, gain * math.sqrt(3.0 / fan_in(shape)), dtype)


def kaiming_normal(rng, shape, mode="fan_out", dtype=np.float32):
    """He normal for ReLU nets (torchvision's ResNet/VGG conv init)."""
    fan = fan_in(shape) if mode == "fan_in" else shape[0] * (int(np.prod(shape[2:])) if len(shape) > 2 else 1)
    return (rng.standard_normal(shape) * math.sqrt(2.0 / fan)).astype(dtype)


def bias_uniform(rng, weight_shape, n, dtype=np.float32):
    bound = 1.0 / math.sqrt(fan_in(weight_shape)) if fan_in(weight_shape) > 0 else 0.0
    return uniform(rng, (n,), bound, dtype)


def normal(rng, shape, std, dtype=np.float32):
    return (rng.standard_normal(shape) * std).astype(dtype)
