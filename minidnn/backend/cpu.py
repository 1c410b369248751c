"""The CPU backend: NumPy arrays, minidnn's C++ kernels, memory as aligned byte buffers."""
from __future__ import annotations

import contextlib
import queue
import threading
import time
import warnings

import numpy as np

from ..errors import BackendUnavailable
from ..ops import conv_algos
from ..schedule import ALIGN
from .lanes import Lanes


class CPUBackend:
    """Device memory is host memory here; the executor treats it exactly as it would a GPU's."""

    name = "cpu"
    xp = np
    native_ops = frozenset()    # its kernels are fp32: a bf16/fp16 graph stages every op but copies (ops.staging)

    def __init__(self, implicit=None, winograd=True):
        """``implicit``: whether convolutions may use the implicit algorithm (None: where the CPU
        runs it); ``winograd``: whether they may use the Winograd ones (see ops.conv_algos)."""
        try:
            from .. import _C
        except ImportError as e:  # a source checkout without the built extension
            raise BackendUnavailable(f"minidnn's C++ extension is not built ({e}); install with 'pip install .'")
        self.k = _C
        self.lanes = Lanes(_C)
        self.conv = conv_algos.Convolutions(self.lanes, implicit, winograd)   # the convolution algorithms
        from .. import OMP_RUNTIME_LOADED_BEFORE, OPENBLAS_LOADED_BEFORE
        if OMP_RUNTIME_LOADED_BEFORE:
            warnings.warn("PyTorch was imported before minidnn and loaded the OpenMP runtime with spinning "
                          "worker threads, which can make minidnn's CPU kernels several times slower: import "
                          "minidnn first, or set OMP_WAIT_POLICY=PASSIVE in the environment", RuntimeWarning,
                          stacklevel=3)
        if OPENBLAS_LOADED_BEFORE and self.lanes.threaded_openblas():
            warnings.warn("NumPy was imported before minidnn, so its OpenBLAS threads keep spinning for about "
                          "0.1 s after every call, on the cores minidnn's kernels need next (a ResNet-18 step "
                          "measured 1.4x slower): import minidnn before NumPy, or set "
                          "OPENBLAS_THREAD_TIMEOUT=16 in the environment", RuntimeWarning, stacklevel=3)

    def empty(self, nbytes: int) -> np.ndarray:
        """A byte buffer of ``nbytes`` whose address is a multiple of the alignment."""
        raw = np.empty(int(nbytes) + ALIGN, np.uint8)
        skip = (-raw.ctypes.data) % ALIGN
        return raw[skip:skip + int(nbytes)]

    host_empty = empty   # the host store: plain memory here, pinned memory on CUDA

    def write(self, dst, src):
        """``dst[...] = src`` (the persistent region takes in parameters)."""
        dst[...] = src

    def load(self, dst, src):
        """The load step: a batch from the caller into the arena."""
        np.copyto(dst, src, casting="same_kind")

    def copy_stream(self):
        return CopyStream()

    def copy_bandwidth(self, nbytes=64 << 20, repeats=3) -> float:
        """Bytes per second of one copy between two buffers of ``nbytes`` (arena <-> host store)."""
        a, b = self.empty(nbytes), self.host_empty(nbytes)
        a[...] = 1
        best = np.inf
        for _ in range(repeats):
            t = time.perf_counter()
            np.copyto(b, a)
            best = min(best, time.perf_counter() - t)
        return nbytes / best

    def copy_overlap(self, nbytes=32 << 20, repeats=5) -> float:
        """The fraction of a copy's time that compute beside it keeps: 1 when copies cost compute
        nothing, 0 when compute stops for them (the copy thread shares the cores and the memory
        bus). Times GEMMs alone, a copy alone and both at once (the copy on the copy stream); the
        fastest of ``repeats`` each, as other load on the machine only ever slows a run down."""
        a, h = self.empty(nbytes), self.host_empty(nbytes)
        a[...] = 1
        m = np.ones((384, 384), np.float32)
        stream = self.copy_stream()

        def gemms():
            for _ in range(24):
                m @ m

        def timed(fn):
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t

        def both():
            done = stream.copy(h, a)
            gemms()
            stream.wait(done)

        try:
            alone_c = min(timed(gemms) for _ in range(repeats))
            alone_x = min(timed(lambda: stream.wait(stream.copy(h, a))) for _ in range(repeats))
            together = min(timed(both) for _ in range(repeats))
        finally:
            stream.close()
        return float(np.clip((alone_c + alone_x - together) / min(alone_c, alone_x), 0.0, 1.0))

    def compute_scope(self):
        return contextlib.nullcontext()

    def planning_cost(self, base, profile):
        """The cost model plans use on this backend: the trainer's own (None: the device profile),
        choosing among this backend's convolution algorithms (their lane variants too)."""
        from ..memory.costmodel import ProfileCost
        return BackendAlgorithms(base if base is not None else ProfileCost(profile), self.conv)

    def profile_algorithms(self, op, in_specs, out_specs, pass_) -> dict:
        """{algorithm: seconds} of a layer's pass, measured here (cached on disk)."""
        from ..algo_cache import profile_conv
        return profile_conv(op, in_specs, out_specs, pass_, self)

    def asarray(self, x, dtype=None):
        return np.asarray(x, dtype=dtype)

    def to_host(self, x) -> np.ndarray:
        return np.asarray(x)

    def synchronize(self):
        pass

    clock = staticmethod(time.perf_counter)   # the clock traces are stamped with

    def describe(self) -> str:
        return "cpu (NumPy + minidnn._C)"

    def check_precision(self, precision):
        """Every precision runs here: bf16/fp16 ops stage their arguments in fp32 (ops.staging);
        tf32 is fp32 math (the CPU has no TF32)."""


class BackendAlgorithms:
    """A cost model whose ops choose among the backend's algorithms (``conv.algorithms``)."""

    def __init__(self, cost, conv):
        self.cost, self._conv = cost, conv

    def algorithms(self, op, in_specs, out_specs, pass_) -> list:
        return self._conv.algorithms(op, in_specs, out_specs, pass_)

    def __getattr__(self, name):           # the wrapped model's times
        if name == "cost":
            raise AttributeError(name)
        return getattr(self.cost, name)


class CopyStream:
    """The CPU's copy engine: a worker thread running copies in FIFO order.

    ``copy(dst, src)`` returns at once with a ``threading.Event`` that is set
    when the copy is done; NumPy releases the GIL while copying, so copies
    overlap with the compute thread as DMA overlaps with kernels on a GPU.
    """

    def __init__(self):
        self._q: queue.Queue = queue.Queue()
        self._error = None
        self._thread = threading.Thread(target=self._work, name="minidnn-copy", daemon=True)
        self._thread.start()

    def _work(self):
        while True:
            item = self._q.get()
            if item is None:
                return
            dst, src, done, on_done = item
            start = time.perf_counter()
            try:
                np.copyto(dst, src)
            except BaseException as e:  # surfaced to the compute thread on wait()
                self._error = e
            try:
                if on_done is not None:
                    on_done(start, time.perf_counter())
            finally:
                done.set()
                self._q.task_done()

    def copy(self, dst, src, on_done=None) -> threading.Event:
        """Queue ``dst[...] = src``; ``on_done(start, end)`` runs on the copy thread when it is done."""
        done = threading.Event()
        self._q.put((dst, src, done, on_done))
        return done

    def wait(self, event):
        event.wait()
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"copy stream failed: {err}") from err

    def settle(self):
        """Nothing to do: the copy thread reports each span as its copy ends (the CUDA stream reads
        its spans here, before the trace closes)."""

    def drain(self):
        """Wait until every queued copy is done, and forget a failed one's error (its iteration was
        abandoned): after an exception, nothing lands later in memory the next iteration uses."""
        self._q.join()
        self._error = None

    def close(self):
        self._q.put(None)
        self._thread.join()
