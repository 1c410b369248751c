"""Which precisions the CUDA backend trains in (importable without CuPy or a GPU)."""
from __future__ import annotations

from ...errors import BackendUnavailable


def check_precision(precision, tf32=False):
    """Refuse bf16/fp16 (its kernels do not take low-precision tensors yet); fp32 and tf32 run
    (tf32: create the backend with ``tf32=True`` for cuDNN's TF32 tensor cores)."""
    if precision.mixed:
        raise BackendUnavailable(f"precision {precision.name}: the CUDA backend does not run mixed precision yet; "
                                 f"train with precision='fp32' or 'tf32' on CUDA, or with "
                                 f"precision='{precision.name}' on device='cpu'")
