"""The CPU backend: NumPy arrays, minidnn's C++ kernels, memory as aligned byte buffers."""
from __future__ import annotations

import numpy as np

from ..errors import BackendUnavailable
from ..schedule import ALIGN


class CPUBackend:
    """Device memory is host memory here; the executor treats it exactly as it would a GPU's."""

    name = "cpu"
    xp = np

    def __init__(self):
        try:
            from .. import _C
        except ImportError as e:  # a source checkout without the built extension
            raise BackendUnavailable(f"minidnn's C++ extension is not built ({e}); install with 'pip install .'")
        self.k = _C

    def empty(self, nbytes: int) -> np.ndarray:
        """A byte buffer of ``nbytes`` whose address is a multiple of the alignment."""
        raw = np.empty(int(nbytes) + ALIGN, np.uint8)
        skip = (-raw.ctypes.data) % ALIGN
        return raw[skip:skip + int(nbytes)]

    def asarray(self, x, dtype=None):
        return np.asarray(x, dtype=dtype)

    def to_host(self, x) -> np.ndarray:
        return np.asarray(x)

    def synchronize(self):
        pass

    def describe(self) -> str:
        return "cpu (NumPy + minidnn._C)"
