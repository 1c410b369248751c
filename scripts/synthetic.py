"""The benchmarks' shared input: one seeded synthetic batch at a model's own input size."""
from __future__ import annotations

import minidnn  # noqa: F401  before NumPy: it sets OpenBLAS's thread timeout, read when NumPy loads OpenBLAS
import numpy as np

from minidnn import models


def synthetic_batch(model, batch_size, classes=10, seed=0, image_size=None):
    """(input shape, float32 images, integer labels) for ``batch_size`` samples of ``model``'s input
    (``image_size``: square images of that side instead of the model's own size)."""
    c, h, w = models.default_input(model)
    h, w = (h, w) if image_size is None else (image_size, image_size)
    shape = (batch_size, c, h, w)
    rng = np.random.default_rng(seed)
    return shape, rng.standard_normal(shape).astype(np.float32), rng.integers(0, classes, batch_size)
