"""The precision policy of a training step, chosen at compile time (``compile(..., precision=)``).

``fp32``: every tensor and every kernel in the training dtype (minidnn's default, unchanged).
``tf32``: fp32 storage, TF32 math where the backend has it (cuDNN's tensor cores; on the CPU it
is fp32 math and the plan says so). ``bf16`` and ``fp16``: torch.autocast's mixed precision.
Parameters, their gradients and the optimizer state stay fp32 in the persistent region (the
master weights); the graph casts them and the activations to the low dtype where an op runs in
it (:mod:`minidnn.autocast`), and every kernel accumulates in fp32. ``fp16`` trains with dynamic
loss scaling (:mod:`minidnn.grad_scaler`); ``bf16`` has fp32's range and needs none.

bfloat16 is ``ml_dtypes.bfloat16`` (a NumPy dtype; its casts round to nearest even, as PyTorch's);
float16 is NumPy's own.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .errors import ConfigError
from .memory.profiles import PRECISIONS

BF16 = np.dtype(ml_dtypes.bfloat16)
FP16 = np.dtype(np.float16)
FP32 = np.dtype(np.float32)
LOW_DTYPES = (BF16, FP16)


def is_float(dtype) -> bool:
    """Whether ``dtype`` is a floating-point type (NumPy's own, or bfloat16, whose kind is 'V')."""
    dt = np.dtype(dtype)
    return dt.kind == "f" or dt == BF16


def is_low(dtype) -> bool:
    """Whether ``dtype`` is one of mixed precision's 2-byte types."""
    return np.dtype(dtype) in LOW_DTYPES


def eps(dtype) -> float:
    """The machine epsilon of a float dtype (bfloat16's 2^-7, float16's 2^-10, float32's 2^-23)."""
    return float(ml_dtypes.finfo(np.dtype(dtype)).eps) if np.dtype(dtype) == BF16 else float(np.finfo(dtype).eps)


@dataclass(frozen=True)
class Precision:
    """One of PRECISIONS as the graph, the backend and the trainer need it."""

    name: str
    low: np.dtype = None        # the dtype convolutions and GEMMs run in and activations are stored in
    scaled: bool = False        # dynamic loss scaling (fp16)
    tf32: bool = False          # TF32 math for fp32 convolutions and GEMMs where the backend has it

    @property
    def mixed(self) -> bool:
        return self.low is not None

    def describe(self, backend_name=None) -> str:
        """One line for plan summaries and the command line (``backend_name``: where it runs, if known)."""
        if self.name == "tf32":
            how = {"cuda": "TF32 math", "cpu": "fp32 math (the CPU has no TF32)"}.get(
                backend_name, "TF32 math on a GPU's tensor cores, fp32 math on the CPU")
            return f"precision tf32: fp32 storage, {how}"
        if not self.mixed:
            return "precision fp32"
        scaling = "dynamic loss scaling (GradScaler's rules)" if self.scaled else "no loss scaling"
        return (f"precision {self.name}: activations and convolution/linear math in {self.name} with fp32 "
                f"accumulation, fp32 master weights, BatchNorm statistics and loss; {scaling}")


_POLICIES = {"fp32": Precision("fp32"), "tf32": Precision("tf32", tf32=True),
             "bf16": Precision("bf16", BF16), "fp16": Precision("fp16", FP16, scaled=True)}
assert tuple(sorted(_POLICIES)) == tuple(sorted(PRECISIONS))


def get_precision(precision) -> Precision:
    """The policy named ``precision`` (a Precision passes through); ConfigError naming the choices."""
    if isinstance(precision, Precision):
        return precision
    p = _POLICIES.get(precision) if isinstance(precision, str) else None
    if p is None:
        raise ConfigError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)} "
                          f"(compile(precision=...), minidnn train/plan/models --precision)")
    return p
