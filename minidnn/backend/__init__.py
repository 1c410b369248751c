"""Backends: what the executor needs from a device (see DESIGN.md)."""
from ..errors import BackendUnavailable


def get_backend(device="cpu"):
    """The backend for ``device`` ("cpu" or "cuda")."""
    if device == "cpu":
        from .cpu import CPUBackend
        return CPUBackend()
    if device == "cuda":
        raise BackendUnavailable("the cuda backend is not available in this build")
    raise ValueError(f"unknown device {device!r}: use 'cpu' or 'cuda'")
