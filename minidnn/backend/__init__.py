"""Backends: what the executor needs from a device (see DESIGN.md)."""
import numpy as np


def to_numpy(a):
    """A NumPy array of ``a``: NumPy arrays as they are, device arrays (CuPy) copied to the host."""
    if isinstance(a, np.ndarray) or not hasattr(a, "get"):
        return np.asarray(a)
    return a.get()


def get_backend(device="cpu"):
    """The backend for ``device``: "cpu", "cuda" (raises BackendUnavailable naming what is missing),
    or a backend object, returned as it is (e.g. ``minidnn.backend.cuda.create(tf32=True)``)."""
    if not isinstance(device, str):
        return device
    if device == "cpu":
        from .cpu import CPUBackend
        return CPUBackend()
    if device == "cuda":
        from .cuda import create
        return create()
    raise ValueError(f"unknown device {device!r}: use 'cpu' or 'cuda'")
