"""The communication stream on the CPU: one thread that owns every MPI call of the run.

MPICH advances a non-blocking collective only inside MPI calls, so a reduction
started by the compute thread would not move while that thread computes. Here
a thread runs the collectives one at a time, in the order they were submitted
(the same on every rank: the program's order), polling each with ``Test`` and
sleeping between polls, so the compute keeps its cores.

The same thread exchanges heartbeats with every peer on a second duplicated
communicator: each carries the number of collectives its rank has started. A
running collective fails as soon as a peer has been silent for half the
timeout, naming it (dead or stopped, whatever it was doing: its communication
thread beats whatever its compute does), or once it has waited ``timeout``
with every peer beating, naming the ranks that are behind (hung before
reaching it). Every waiter then gets that :class:`DistributedError`: the
thread is the only judge of a collective, so no waiter has a deadline of its
own that could fire first with a message that names no one.
"""
from __future__ import annotations

import atexit
import pickle
import queue
import threading
import time

import numpy as np

from ..errors import DistributedError

# a collective waits at most this long for peers that still beat (hung before reaching it)
TIMEOUT_SECONDS = 30.0
# a heartbeat each second: a silent rank is named within SILENT_FRACTION * TIMEOUT_SECONDS plus one
# beat of the first collective that waits for it (15 s, 16 s at most, by default)
HEARTBEAT_SECONDS = 1.0
# a peer silent for half the timeout has stopped or died (its communication thread beats whatever
# its compute does: fifteen missed beats are not a slow step); one that beats but has not started
# the collective is hung before it, and is named once the whole timeout has passed
SILENT_FRACTION = 0.5
# sleep between two polls of a running collective: MPICH moves a collective only inside MPI calls,
# and 50 us keeps a small reduction within tens of microseconds of its own time while the compute
# thread keeps the cores (a spinning poll took one of this machine's two cores from the compute);
# the sleep doubles while a collective waits for a peer that is behind, up to 1 ms (each poll
# takes the GIL from the compute thread of this rank)
POLL_SECONDS = 50e-6
POLL_MAX_SECONDS = 1e-3
# heartbeats to one peer that may wait undelivered before this rank sends it no more: a peer that
# receives takes each within a beat, so more than a few pending means it stopped receiving
PENDING_BEATS = 4
_HEARTBEAT_TAG = 7


class Pending:
    """A submitted collective: ``wait()`` returns once it is done, or raises its failure."""

    __slots__ = ("done", "error", "result", "seconds")

    def __init__(self):
        self.done = threading.Event()
        self.error = None
        self.result = None
        self.seconds = None        # (start, end) on the thread's clock, for traces

    def wait(self):
        """The result, once the communication thread has finished this collective or failed it
        (within its timeout, naming the rank at fault)."""
        self.done.wait()
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
        self._sends = {r: [] for r in peers}    # each peer's heartbeats not yet delivered
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
        if self._closed:                   # no thread would run it: its waiter would wait forever
            p.error = self.failure or DistributedError(f"rank {self.rank}: the communication thread is closed")
            p.done.set()
        elif self.failure is not None:
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
                except Exception as e:           # the waiters have no deadline of their own: never leave one
                    self.failure = DistributedError(f"rank {self.rank}: the communication thread failed: {e!r}")
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
                if self._silent(now) or now - began > self.timeout:
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
        for r, sends in self._sends.items():
            sends[:] = [s for s in sends if not s[0].Test()]
            # a peer that stopped takes no more: its undelivered beats do not pile up, and the
            # others still get theirs (one peer's silence must not make this rank look silent)
            if len(sends) < PENDING_BEATS:
                msg = np.array([self.started], np.int64)
                sends.append((self.beats.Isend(msg, dest=r, tag=_HEARTBEAT_TAG), msg))

    def _silent(self, now) -> list:
        """The peers not heard from for SILENT_FRACTION of the timeout, in rank order."""
        return sorted(r for r, t in self._heard.items() if now - t > SILENT_FRACTION * self.timeout)

    def _diagnose(self, now) -> str:
        quiet = SILENT_FRACTION * self.timeout
        silent = self._silent(now)
        if silent:
            who = ", ".join(f"rank {r}" for r in silent)
            return (f"rank {self.rank}: {who} stopped responding (no heartbeat for {quiet:.0f} s): "
                    f"dead or stopped")
        behind = sorted(r for r, n in self._progress.items() if n < self.started)
        who = ", ".join(f"rank {r} (at collective {self._progress[r]})" for r in behind) or "no rank"
        return (f"rank {self.rank}: collective {self.started} did not finish within {self.timeout:.0f} s; "
                f"{who} has not reached it: hung")
