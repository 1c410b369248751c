"""The CUDA backend: CuPy arrays, minidnn's cuDNN binding, streams and pinned host memory.

Importing this package imports nothing from CUDA; :func:`create` checks what
the machine has (:func:`.loader.status`) and raises BackendUnavailable naming
what is missing. Only this package imports ``cupy``.
"""
from .loader import CudaStatus, status


def create(**options):
    """A ready :class:`~.backend.CUDABackend` (``options``: tf32, deterministic, device)."""
    from .loader import require
    require()
    from .backend import CUDABackend
    return CUDABackend(**options)


__all__ = ["create", "status", "CudaStatus"]
