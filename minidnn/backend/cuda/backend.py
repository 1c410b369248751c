"""The CUDA backend: one device arena, a pinned host store, a compute and a copy stream, cuDNN.

Memory comes straight from ``cudaMalloc`` / ``cudaHostAlloc`` (CuPy's
``Memory`` and ``PinnedMemory``), not from CuPy's pools, so the arena and the
host store are exactly the bytes the plan asks for; buffers are views of them
by offset. Every kernel of a step runs on the compute stream (the executor
enters :meth:`compute_scope` around a run); cuDNN's handle is bound to it.
"""
from __future__ import annotations

import contextlib
import time

import cupy as cp
import numpy as np

from .conv import CudnnConv
from .kernels import CudaKernels
from .loader import load_binding
from .precision import NATIVE_OPS, check_precision
from .streams import CudaCopyStream, bandwidth


class CUDABackend:
    name = "cuda"
    xp = cp
    native_ops = NATIVE_OPS     # ops whose kernels read and write bf16/fp16: a graph traced for this backend
                                # may leave them unstaged (ops.staging); the others stage through fp32

    def __init__(self, device=0, tf32=False, deterministic=True, algo_cache=None):
        """``tf32``: let cuDNN use TF32 tensor cores for float32 convolutions (PyTorch's default;
        off by default so float32 results are float32-accurate). ``deterministic``: list only
        deterministic cuDNN algorithms, so budgets keep runs bitwise identical. ``algo_cache``:
        where Find's times are kept (an ``AlgoCache``; None: the default file; False: none)."""
        self.device = cp.cuda.Device(device)
        self.device.use()
        # a blocking stream: work on the legacy default stream (parameters moved in, a user's own
        # CuPy calls) is ordered with it; the copy stream is non-blocking, so copies overlap
        self.stream = cp.cuda.Stream(non_blocking=False)
        self.cudnn = load_binding()
        self.handle = self.cudnn.Handle(self.stream.ptr)
        self.k = CudaKernels()
        if algo_cache is None:
            from ...algo_cache import AlgoCache
            algo_cache = AlgoCache()
        self.conv = CudnnConv(self.cudnn, self.handle, tf32=tf32, deterministic=deterministic,
                              cache=algo_cache or None, device_name=self._device_name())
        self.cudnn_version = self.cudnn.version()

    # -- memory -------------------------------------------------------------
    def empty(self, nbytes: int):
        """A device byte buffer of its own cudaMalloc (256-byte aligned)."""
        nbytes = int(nbytes)
        if nbytes == 0:
            return cp.empty(0, cp.uint8)
        mem = cp.cuda.Memory(nbytes)
        return cp.ndarray((nbytes,), cp.uint8, cp.cuda.MemoryPointer(mem, 0))

    def host_empty(self, nbytes: int) -> np.ndarray:
        """Pinned host memory, allocated once (page-aligned), as a NumPy byte array."""
        nbytes = int(nbytes)
        if nbytes == 0:
            return np.empty(0, np.uint8)
        mem = cp.cuda.PinnedMemory(nbytes)
        return np.frombuffer(cp.cuda.PinnedMemoryPointer(mem, 0), np.uint8, nbytes)

    def write(self, dst, src):
        """``dst[...] = src`` from host or device data (cast to dst's dtype)."""
        if isinstance(src, cp.ndarray):
            dst[...] = src.reshape(dst.shape)
        else:
            with self.stream:
                dst.set(np.ascontiguousarray(np.asarray(src).reshape(dst.shape), dtype=dst.dtype), stream=self.stream)

    load = write        # the load step: a batch from the caller into the arena

    def copy_stream(self):
        return CudaCopyStream(self.stream)

    def copy_bandwidth(self, nbytes=64 << 20, repeats=3) -> float:
        return bandwidth(self, nbytes, repeats)

    def copy_overlap(self) -> float:
        """Copies run on the GPU's copy engine beside kernels: compute loses none of its time."""
        return 1.0

    def compute_scope(self):
        """Kernels launched inside run on the compute stream."""
        return self.stream

    # -- arrays -----------------------------------------------------------
    def asarray(self, x, dtype=None):
        return cp.asarray(x, dtype=dtype)

    def to_host(self, x) -> np.ndarray:
        return cp.asnumpy(x, stream=self.stream) if isinstance(x, cp.ndarray) else np.asarray(x)

    def synchronize(self):
        self.stream.synchronize()

    clock = staticmethod(time.perf_counter)

    # -- planning -------------------------------------------------------------
    def planning_cost(self, base, profile):
        from ...memory.config import gpu_profile
        from ...memory.costmodel import ProfileCost
        from .cost import DeviceCost
        return DeviceCost(base if base is not None else ProfileCost(gpu_profile(profile, self._device_name())), self)

    def profile_algorithms(self, op, in_specs, out_specs, pass_) -> dict:
        """Nothing for the profiling pass to time: :meth:`planning_cost` answers with Find's times."""
        return {}

    def _device_name(self) -> str:
        p = cp.cuda.runtime.getDeviceProperties(self.device.id)
        return p["name"].decode() if isinstance(p["name"], bytes) else p["name"]

    def check_precision(self, precision):
        """Every precision runs here, but bf16 on a GPU before sm_80 or with a CuPy before 14
        (BackendUnavailable naming the alternative; see :mod:`.precision`)."""
        check_precision(precision, int(self.device.compute_capability), int(cp.__version__.split(".")[0]))

    def describe(self) -> str:
        return f"cuda:{self.device.id} {self._device_name()} (CuPy {cp.__version__}, cuDNN {self.cudnn_version})"

    def close(self):
        self.handle.close()
        with contextlib.suppress(Exception):
            self.stream.synchronize()
