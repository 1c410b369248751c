"""The copy stream of the CUDA backend: asynchronous copies between the arena and pinned host memory.

A copy first waits (on the GPU) for the work already queued on the compute
stream, so it reads what the kernels wrote; the executor's ``wait`` makes the
compute stream wait for the copy's event - the host never blocks, the GPU
orders the two streams. Copies run in FIFO order on one non-blocking stream.
A traced copy's span is read from its GPU events when the iteration settles
(:meth:`CudaCopyStream.settle`, before the trace closes), not when it is
waited for: reading it there would block the host on every traced copy.
"""
from __future__ import annotations

import time

import cupy as cp
import numpy as np

_MEMCPY_DEFAULT = 4   # cudaMemcpyDefault: the direction follows from the (unified) addresses


def address(a) -> int:
    """The address of a contiguous NumPy (pinned host) or CuPy (device) array."""
    return a.data.ptr if isinstance(a, cp.ndarray) else a.ctypes.data


class CopyEvent:
    """A queued copy; ``is_set()`` is true once the GPU has finished it."""

    def __init__(self, start, done, on_done, enqueued):
        self.start, self.done, self.on_done, self.enqueued = start, done, on_done, enqueued

    def is_set(self) -> bool:
        return self.done.done


class CudaCopyStream:
    def __init__(self, compute):
        self.compute = compute
        self.stream = cp.cuda.Stream(non_blocking=True)
        self._timed = []          # waited-for traced copies whose spans are not yet reported

    def copy(self, dst, src, on_done=None) -> CopyEvent:
        """Queue ``dst[...] = src`` (same bytes; one side device, the other pinned host)."""
        if dst.nbytes != src.nbytes:
            raise ValueError(f"copy of {src.nbytes} bytes into {dst.nbytes}")
        for a, what in ((dst, "destination"), (src, "source")):
            if not a.flags.c_contiguous:
                raise ValueError(f"copy {what} is not contiguous")
        ready = cp.cuda.Event(disable_timing=True)
        ready.record(self.compute)
        self.stream.wait_event(ready)
        start = cp.cuda.Event() if on_done is not None else None
        if start is not None:
            start.record(self.stream)
        cp.cuda.runtime.memcpyAsync(address(dst), address(src), dst.nbytes, _MEMCPY_DEFAULT, self.stream.ptr)
        done = cp.cuda.Event(disable_timing=on_done is None)
        done.record(self.stream)
        return CopyEvent(start, done, on_done, time.perf_counter())

    def wait(self, event: CopyEvent):
        """Order the compute stream after the copy; the host does not block."""
        self.compute.wait_event(event.done)
        if event.on_done is not None:
            self._timed.append(event)

    def settle(self):
        """Report the spans of the traced copies waited for so far (blocks until they are done)."""
        for event in self._timed:
            if event.on_done is not None:
                event.done.synchronize()
                seconds = cp.cuda.get_elapsed_time(event.start, event.done) * 1e-3
                event.on_done(event.enqueued, event.enqueued + seconds)
                event.on_done = None
        self._timed.clear()

    def drain(self):
        """Wait until every queued copy is done (after an exception: nothing lands later, and the
        abandoned iteration's spans are not reported)."""
        self.stream.synchronize()
        self._timed.clear()

    def close(self):
        self.stream.synchronize()


def bandwidth(backend, nbytes, repeats) -> float:
    """Bytes per second of arena -> pinned host copies on a copy stream."""
    a, b = backend.empty(nbytes), backend.host_empty(nbytes)
    a.fill(1)
    s = CudaCopyStream(backend.stream)
    best = np.inf
    for _ in range(repeats + 1):
        t = time.perf_counter()
        s.wait(s.copy(b, a))
        s.stream.synchronize()
        best = min(best, time.perf_counter() - t)
    return nbytes / best
