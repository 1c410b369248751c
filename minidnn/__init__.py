"""minidnn: a minimal deep-learning framework whose executor plans every buffer to fit a memory budget."""
import os
import sys

# OpenMP worker threads that spin after a kernel steal the cores NumPy's BLAS threads need
# next (a 2-core LeNet step measured 62 ms spinning, 7 ms passive; ResNet-18 3.4 s vs 1.2 s).
# The OpenMP runtime reads this once, when the first library that uses it loads: so it is
# set here, at import, and a user's own setting wins. A library imported earlier that
# loaded the runtime (PyTorch does) has fixed the policy already: the CPU backend warns.
OMP_RUNTIME_LOADED_BEFORE = "OMP_WAIT_POLICY" not in os.environ and "torch" in sys.modules
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# OpenBLAS's worker threads likewise spin after each call, by default for 2^28 cycles (a tenth
# of a second): through the OpenMP kernels that follow a GEMM, on a core they need (the implicit
# convolution's backward measured 2x slower right after a GEMM; a ResNet-18 step 1.4x). 2^16
# cycles (tens of microseconds) still carries one GEMM into the next. OpenBLAS reads this when
# it loads, with NumPy: where NumPy came first it is too late, and the CPU backend warns.
OPENBLAS_LOADED_BEFORE = "OPENBLAS_THREAD_TIMEOUT" not in os.environ and "numpy" in sys.modules
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "16")

from . import distributed, nn, optim  # noqa: E402
from .errors import (BackendUnavailable, CheckpointError, ConfigError, DataError, DistributedError,  # noqa: E402
                     MemoryBudgetError, MinidnnError, NumericalError, ShapeError)
from .memory import MemoryConfig  # noqa: E402
from .trainer import Trainer, compile  # noqa: E402
from .training import evaluate, fit, load, save  # noqa: E402

__version__ = "0.1.0"

__all__ = ["nn", "optim", "distributed", "compile", "Trainer", "fit", "evaluate", "save", "load", "MemoryConfig",
           "ShapeError", "MemoryBudgetError", "BackendUnavailable", "DataError", "CheckpointError", "NumericalError",
           "ConfigError", "DistributedError", "MinidnnError"]
