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
cancels the lanes not yet started and waits for the running ones; the step's
transaction (minidnn.transaction) then rolls back a state nothing writes to any more.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait


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
        futures = []
        try:
            try:
                for j in range(p):
                    futures.append(pool.submit(fn, j))
                for f in futures:
                    f.exception()             # wait for every lane before any error surfaces
            except BaseException:             # raised in this thread, the lanes still running
                for f in futures:
                    f.cancel()                # those not started never start
                _wait_out(futures)
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


def _wait_out(futures):
    """Return once no lane of ``futures`` runs, even if more exceptions are raised here meanwhile
    (a second signal): the first one is the one that propagates, after the lanes, which finish
    their piece of a kernel in moments."""
    while True:
        try:
            wait(futures)
            return
        except BaseException:
            continue
