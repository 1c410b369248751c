"""The communication stream on the CPU: one thread that owns every MPI call of the run.

MPICH advances a non-blocking collective only inside MPI calls, so a reduction
started by the compute thread would not move while that thread computes. Here
a thread runs the collectives one at a time, in the order they were submitted
(the same on every rank: the program's order), polling each with ``Test`` and
sleeping between polls, so the compute keeps its cores.

The same thread exchanges heartbeats with every peer on a second duplicated
communicator: each carries the number of collectives its rank has started. A
collective that does not finish within ``timeout`` fails, naming the rank that
stopped answering (dead or stopped) or the rank that is behind (hung before
reaching the collective); every waiter then gets a :class:`DistributedError`.
"""
from __future__ import annotations

import atexit
import pickle
import queue
import threading
import time

import numpy as np

from ..errors import DistributedError

# a rank is reported missing once it has been silent this long; a reduction waits at most this
TIMEOUT_SECONDS = 30.0
# a heartbeat each second: a dead rank is named within TIMEOUT_SECONDS plus one beat
HEARTBEAT_SECONDS = 1.0
# a peer silent for half the timeout has stopped (its communication thread beats whatever its
# compute does); one that beats but has not started the collective is hung before it
SILENT_FRACTION = 0.5
# sleep between two polls of a running collective: MPICH moves a collective only inside MPI calls,
# and 50 us keeps a small reduction within tens of microseconds of its own time while the compute
# thread keeps the cores (a spinning poll took one of this machine's two cores from the compute);
# the sleep doubles while a collective waits for a peer that is behind, up to 1 ms (each poll
# takes the GIL from the compute thread of this rank)
POLL_SECONDS = 50e-6
POLL_MAX_SECONDS = 1e-3
_HEARTBEAT_TAG = 7


class Pending:
    """A submitted collective: ``wait()`` returns once it is done, or raises its failure."""

    __slots__ = ("done", "error", "result", "seconds")

    def __init__(self):
        self.done = threading.Event()
        self.error = None
        self.result = None
        self.seconds = None        # (start, end) on the thread's clock, for traces

    def wait(self, timeout=None):
        if not self.done.wait(timeout):
            raise DistributedError(f"a collective did not finish within {timeout:.0f} s")
        if self.error is not None:
            raise self.error
        return self.result


class CommThread:
    """Runs collectives on a duplicate of ``comm`` (an mpi4py communicator) in submission order."""

    def __init__(self, comm, timeout=TIMEOUT_SECONDS, clock=time.perf_counter):
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = comm.Dup()
        self.beats = comm.Dup()
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.timeout, self.clock = float(timeout), clock
        self.started = 0                      # collectives this rank has started
        self.failure = None
        self._jobs = queue.Queue()
        peers = [r for r in range(self.size) if r != self.rank]
        self._heard = {r: time.monotonic() for r in peers}
        self._progress = {r: 0 for r in peers}
        self._inbox = {r: np.zeros(1, np.int64) for r in peers}
        self._recvs = {r: self.beats.Irecv(self._inbox[r], source=r, tag=_HEARTBEAT_TAG) for r in peers}
        self._sends = []
        self._next_beat = 0.0
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="minidnn-comm", daemon=True)
        self._thread.start()
        atexit.register(self.close)         # before mpi4py finalizes MPI (registered earlier, runs later)

    # -- submitting (any thread) ----------------------------------------------
    def allreduce(self, buf) -> Pending:
        """Sum ``buf`` (a contiguous array) over the ranks, in place."""
        return self._submit(lambda: self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM), None)

    def allgather(self, send, recv) -> Pending:
        """``recv[r]`` = rank r's ``send`` (``recv`` has a leading axis of the ranks)."""
        return self._submit(lambda: self.comm.Iallgather(send, recv), None)

    def bcast(self, buf, root=0) -> Pending:
        return self._submit(lambda: self.comm.Ibcast(buf, root=root), None)

    def bcast_object(self, obj, root=0):
        """Rank ``root``'s ``obj`` (picklable) on every rank; blocks until it has arrived."""
        blob = pickle.dumps(obj) if self.rank == root else b""
        n = np.array([len(blob)], np.int64)
        self.bcast(n, root).wait()
        buf = np.frombuffer(blob, np.uint8).copy() if self.rank == root else np.empty(int(n[0]), np.uint8)
        self.bcast(buf, root).wait()
        return pickle.loads(buf.tobytes())

    def _submit(self, start, result):
        p = Pending()
        p.result = result
        if self.failure is not None:
            p.error = self.failure
            p.done.set()
        else:
            self._jobs.put((start, p))
        return p

    def close(self):
        """Stop the thread once the submitted collectives are done; later submissions fail at once."""
        if self._closed:
            return
        self._closed = True
        self._jobs.put(None)
        self._thread.join()
        self.failure = self.failure or DistributedError(f"rank {self.rank}: the communication thread is closed")

    # -- the thread ---------------------------------------------------------
    def _loop(self):
        while True:
            try:
                job = self._jobs.get(timeout=HEARTBEAT_SECONDS)
            except queue.Empty:
                if self.failure is None:
                    try:
                        self._beat()
                    except self.MPI.Exception as e:
                        self.failure = DistributedError(f"rank {self.rank}: MPI failed: {e}")
                continue
            if job is None:
                for req in self._recvs.values():   # the heartbeats still expected: none will be
                    req.Cancel()
                    req.Wait()
                return
            start, p = job
            if self.failure is None:
                try:
                    self._run(start, p)
                except DistributedError as e:
                    self.failure = e
                except self.MPI.Exception as e:
                    self.failure = DistributedError(f"rank {self.rank}: MPI failed: {e}")
            p.error = self.failure
            p.done.set()

    def _run(self, start, p):
        t0 = self.clock()
        self.started += 1
        req = start()
        began = time.monotonic()
        pause = POLL_SECONDS
        while not req.Test():
            now = time.monotonic()
            if now >= self._next_beat:
                self._beat()
                if now - began > self.timeout:
                    raise DistributedError(self._diagnose(now))
            time.sleep(pause)
            pause = min(2 * pause, POLL_MAX_SECONDS)
        p.seconds = (t0, self.clock())

    def _beat(self):
        now = time.monotonic()
        self._next_beat = now + HEARTBEAT_SECONDS
        for r, req in self._recvs.items():
            while req.Test():              # a peer's beats since the last look
                self._heard[r] = now
                self._progress[r] = int(self._inbox[r][0])
                req = self._recvs[r] = self.beats.Irecv(self._inbox[r], source=r, tag=_HEARTBEAT_TAG)
        self._sends = [s for s in self._sends if not s[0].Test()]
        if len(self._sends) < 4 * len(self._heard):   # do not pile up sends to a peer that stopped
            for r in self._heard:
                msg = np.array([self.started], np.int64)
                self._sends.append((self.beats.Isend(msg, dest=r, tag=_HEARTBEAT_TAG), msg))

    def _diagnose(self, now) -> str:
        quiet = SILENT_FRACTION * self.timeout
        silent = sorted(r for r, t in self._heard.items() if now - t > quiet)
        if silent:
            who = ", ".join(f"rank {r}" for r in silent)
            return (f"rank {self.rank}: {who} stopped responding (no heartbeat for {quiet:.0f} s): "
                    f"dead or stopped")
        behind = sorted(r for r, n in self._progress.items() if n < self.started)
        who = ", ".join(f"rank {r} (at collective {self._progress[r]})" for r in behind) or "no rank"
        return (f"rank {self.rank}: collective {self.started} did not finish within {self.timeout:.0f} s; "
                f"{who} has not reached it: hung")
