"""Which precisions the CUDA backend trains in, and which ops run mixed precision's dtypes natively
(importable without CuPy or a GPU).

fp32 and tf32 run everywhere (tf32: create the backend with ``tf32=True`` for cuDNN's TF32 tensor
cores). bf16 and fp16 run as torch.autocast does: cuDNN's convolutions on BFLOAT16 / HALF tensors
with FLOAT compute and tensor-op math, cuBLAS's GEMMs on 16-bit arrays with CUBLAS_COMPUTE_32F,
minidnn's raw kernels (pooling, ReLU, BatchNorm with fp32 statistics, bias gradients) reading and
writing the 2-byte type and computing in float. What is refused names the alternative: bf16 on a GPU
without bfloat16 tensor cores (before sm_80: cuDNN has no BFLOAT16 convolutions there), and bf16 with a
CuPy that has no bfloat16 arrays (before CuPy 14).
"""
from __future__ import annotations

from ...errors import BackendUnavailable

# Ops whose CUDA kernels read and write bf16/fp16 themselves (the op's own class runs on the low arrays):
# cuDNN's convolutions, cuBLAS's GEMMs, and the ops on minidnn's raw kernels. A graph that hands these
# ops the low dtype unstaged runs them natively; every other op stages its low arguments through fp32
# (ops.staging), which the CUDA backend runs as the CPU backend does, with CuPy's casts.
NATIVE_OPS = frozenset({"conv2d", "conv_transpose2d", "linear", "batch_norm2d", "relu", "add", "max_pool2d",
                        "avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d"})

BF16_CAPABILITY = 80        # sm_80 (Ampere): bfloat16 tensor cores, and cuDNN's BFLOAT16 convolutions
BF16_CUPY = 14              # CuPy's first major version with bfloat16 arrays (ml_dtypes.bfloat16)


def check_precision(precision, capability, cupy_major):
    """Raise BackendUnavailable (one line, naming what to use instead) where this GPU (compute capability
    ``capability``, e.g. 90) and CuPy (major version ``cupy_major``) cannot train ``precision``."""
    if precision.name != "bf16":
        return
    if capability < BF16_CAPABILITY:
        raise BackendUnavailable(f"precision bf16: this GPU (sm_{capability}) has no bfloat16 tensor cores for "
                                 f"cuDNN; train with precision='fp16' on it, or precision='bf16' on device='cpu'")
    if cupy_major < BF16_CUPY:
        raise BackendUnavailable(f"precision bf16: CuPy {cupy_major} has no bfloat16 arrays; "
                                 f"pip install 'cupy-cuda13x>={BF16_CUPY}', or train with precision='fp16'")
