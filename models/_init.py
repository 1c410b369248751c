"""In-place weight initializers, named after ``torch.nn.init``'s ``*_`` functions.

The layers already draw PyTorch's default initialization when they are built;
the reference models then overwrite some tensors the way torchvision does
(e.g. He-normal convolutions and constant BatchNorm in ResNet). These helpers
write into ``Parameter.data`` directly, drawing float32 numbers straight into
the array, so re-initializing a 100M-parameter model allocates nothing.
"""
from __future__ import annotations

import math

import numpy as np


def fans(shape):
    """(fan_in, fan_out) as PyTorch computes them for a weight of ``shape``."""
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def constant_(param, value):
    param.data[...] = value


def normal_(param, rng, std, mean=0.0):
    w = param.data
    if w.dtype in (np.float32, np.float64) and w.flags.c_contiguous:
        rng.standard_normal(dtype=w.dtype, out=w)
    else:
        w[...] = rng.standard_normal(w.shape)
    if std != 1.0:
        w *= std
    if mean != 0.0:
        w += mean


def trunc_normal_(param, rng, std, mean=0.0, a=-2.0, b=2.0):
    """Normal(mean, std) redrawn until every value lies in [a, b] (``torch.nn.init.trunc_normal_``)."""
    normal_(param, rng, std, mean)
    w = param.data.reshape(-1)
    bad = np.flatnonzero((w < a) | (w > b))
    while bad.size:
        w[bad] = rng.standard_normal(bad.size) * std + mean
        bad = bad[(w[bad] < a) | (w[bad] > b)]


def kaiming_normal_(param, rng, mode="fan_in"):
    """He normal for ReLU networks: std = sqrt(2 / fan), fan by ``mode`` ("fan_in" or "fan_out")."""
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = fans(param.data.shape)
    normal_(param, rng, math.sqrt(2.0 / (fan_in if mode == "fan_in" else fan_out)))
