"""cuBLAS GEMMs the CUDA backend calls itself, with the compute type named per dtype.

Mixed precision's GEMMs read and write 16-bit arrays and accumulate in float32
(``CUBLAS_COMPUTE_32F``), as torch.autocast's do; float32 accumulates in float32
(no TF32: that is ``CUBLAS_COMPUTE_32F_FAST_TF32``, never chosen here) and
float64 in float64. CuPy's own ``matmul`` (Linear's forward and its gradients
without accumulation) makes the same choice for 16-bit arrays under CuPy's
default compute type.
"""
from __future__ import annotations

import cupy as cp
import numpy as np
from cupy_backends.cuda.api import runtime
from cupy_backends.cuda.libs import cublas

# dtype name -> (cudaDataType of the arrays, cublasComputeType_t, dtype of alpha and beta)
TYPES = {
    "float16": (runtime.CUDA_R_16F, cublas.CUBLAS_COMPUTE_32F, np.float32),
    "bfloat16": (runtime.CUDA_R_16BF, cublas.CUBLAS_COMPUTE_32F, np.float32),
    "float32": (runtime.CUDA_R_32F, cublas.CUBLAS_COMPUTE_32F, np.float32),
    "float64": (runtime.CUDA_R_64F, cublas.CUBLAS_COMPUTE_64F, np.float64),
}


def gemm_accumulate(x, gy, gw):
    """``gw += gy.T @ x`` (x: (N, I), gy: (N, O), gw: (O, I), all C-contiguous, one dtype) with cublasGemmEx and
    beta = 1, on the current stream.

    Row-major arrays are cuBLAS's column-major transposes, so this is gw^T (I x O) = x^T (I x N) . gy (N x O):
    A = x^T as stored, B = gy^T as stored and transposed."""
    dt = gw.dtype
    if not (x.dtype == gy.dtype == dt) or dt.name not in TYPES:
        raise TypeError(f"expected float16, bfloat16, float32 or float64 arrays of one dtype, got "
                        f"{x.dtype}, {gy.dtype}, {dt}")
    for a in (x, gy, gw):
        if not a.flags.c_contiguous:
            raise ValueError("expected C-contiguous arrays")
    (n, i), o = x.shape, gy.shape[1]
    if gy.shape[0] != n or gw.shape != (o, i):
        raise ValueError(f"gemm_acc shapes: x {x.shape}, gy {gy.shape}, gw {gw.shape}")
    if not (n and i and o):
        return
    data, compute, scalar = TYPES[dt.name]
    one = np.ones(1, scalar)                  # alpha = beta = 1, read from the host when the call is made
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
    mode = cublas.getPointerMode(handle)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    try:
        cublas.gemmEx(handle, cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_T, i, o, n, one.ctypes.data,
                      x.data.ptr, data, i, gy.data.ptr, data, o, one.ctypes.data, gw.data.ptr, data, i,
                      compute, cublas.CUBLAS_GEMM_DEFAULT)
    finally:
        cublas.setPointerMode(handle, mode)
