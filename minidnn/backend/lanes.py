"""Lanes: the CPU backend's batch parallelism, one single-threaded worker per core.

A convolution's multithreaded GEMM scales poorly on a few cores, and every
hand-over between the BLAS thread pool and the OpenMP team of minidnn's own
kernels costs spinning threads. ``Lanes.run(fn, p)`` instead calls ``fn(j)``
for ``j`` in ``range(p)`` on ``p`` worker threads at once, each running its
kernels and its GEMMs on one thread (OpenMP teams of one, BLAS limited to one
thread while the lanes run), so ``p`` independent pieces of a batch proceed
side by side with no hand-over at all. What ``fn(j)`` computes depends on ``j``
alone, never on which thread runs it, so results are reproducible.

No lane outlives ``run``: the lanes write into the arena, so an exception raised
in the calling thread while it waits (a signal handler that raises) first
closes the run's gate, so that lanes not yet started never start, and waits for
the running ones; the step's transaction (minidnn.transaction) then rolls back a
state nothing writes to any more. The gate counts the lanes that run, not the
futures the calling thread holds: the exception can come while ``submit`` has
started a lane and not yet returned its future.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor


class Lanes:
    def __init__(self, kernels):
        self._k = kernels
        self._pool, self._size = None, 0
        self._blas = None

    def _workers(self, p):
        if self._size < p:
            self.close()
            self._pool, self._size = ThreadPoolExecutor(p, thread_name_prefix="minidnn-lane",
                                                        initializer=self._k.set_num_threads, initargs=(1,)), p
        return self._pool

    def _blas_libraries(self):
        if self._blas is None:
            from threadpoolctl import ThreadpoolController
            self._blas = ThreadpoolController().select(user_api="blas").lib_controllers
        return self._blas

    def threaded_openblas(self) -> bool:
        """Whether an OpenBLAS with worker threads is loaded (BLAS libraries as threadpoolctl sees them)."""
        return any(lib.internal_api == "openblas" and lib.num_threads > 1 for lib in self._blas_libraries())

    def run(self, fn, p):
        """``fn(0), ..., fn(p - 1)`` side by side; returns when all are done (re-raising the first error)."""
        pool = self._workers(p)
        libs = self._blas_libraries()
        threads = [lib.num_threads for lib in libs]
        for lib in libs:
            lib.set_num_threads(1)
        gate, futures = _Gate(), []
        try:
            try:
                for j in range(p):
                    futures.append(pool.submit(gate.lane, fn, j))
                for f in futures:
                    f.exception()             # wait for every lane before any error surfaces
            except BaseException:             # raised in this thread, the lanes still running
                gate.drain()
                raise
            for f in futures:
                f.result()
        finally:
            for lib, n in zip(libs, threads):
                lib.set_num_threads(n)

    def close(self):
        if self._pool is not None:
            self._pool.shutdown()
        self._pool, self._size = None, 0


class _Gate:
    """The lanes of one ``run``: how many run now, and whether the others may still start."""

    def __init__(self):
        self._cv = threading.Condition()
        self._running, self._closed = 0, False

    def lane(self, fn, j):
        with self._cv:
            if self._closed:
                return
            self._running += 1
        try:
            fn(j)
        finally:
            with self._cv:
                self._running -= 1
                self._cv.notify_all()

    def drain(self):
        """Close the gate and return once no lane runs, even if more exceptions are raised here
        meanwhile (a second signal): the first one is the one that propagates, after the lanes,
        which finish their piece of a kernel in moments."""
        while True:
            try:
                with self._cv:
                    self._closed = True
                    while self._running:
                        self._cv.wait()
                return
            except BaseException:
                continue
