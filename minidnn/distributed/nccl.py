"""The communication stream on CUDA: NCCL all-reduces on a stream of their own, ordered by events.

The NCCL unique id is made by rank 0 and broadcast over MPI (the communication
thread's communicator). A bucket's reduction waits, on the NCCL stream, for an
event recorded on the compute stream after the step that wrote its last
gradient; the update that reads the bucket makes the compute stream wait for
the event recorded after the reduction. Neither blocks the host. CuPy is
imported here only, when a CUDA trainer is made data-parallel.
"""
from __future__ import annotations


def device_count() -> int:
    """The GPUs this process sees."""
    import cupy
    return cupy.cuda.runtime.getDeviceCount()


class _Done:
    """``threading.Event``'s ``is_set`` over a CUDA event."""

    __slots__ = ("event",)

    def __init__(self, event):
        self.event = event

    def is_set(self) -> bool:
        return self.event.done


class NcclPending:
    """A reduction on the NCCL stream: ``wait`` orders the compute stream after it."""

    __slots__ = ("done", "seconds", "compute")

    def __init__(self, event, compute):
        self.done = _Done(event)
        self.seconds = None
        self.compute = compute

    def wait(self, timeout=None):
        self.compute.wait_event(self.done.event)


class NcclStream:
    """NCCL over the ranks of ``comm`` (a :class:`~minidnn.distributed.comm.CommThread`)."""

    def __init__(self, comm, backend):
        import cupy
        from cupy.cuda import nccl
        self.cupy, self.nccl = cupy, nccl
        uid = comm.bcast_object(nccl.get_unique_id() if comm.rank == 0 else None)
        self.comm = nccl.NcclCommunicator(comm.size, uid, comm.rank)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.compute = backend.stream
        self.types = {"float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64}

    def allreduce(self, buf) -> NcclPending:
        """Sum ``buf`` (a contiguous CuPy array) over the ranks in place, after the compute so far."""
        cupy = self.cupy
        written = cupy.cuda.Event(disable_timing=True)
        written.record(self.compute)
        self.stream.wait_event(written)
        self.comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, self.types[buf.dtype.name], self.nccl.NCCL_SUM,
                            self.stream.ptr)
        done = cupy.cuda.Event(disable_timing=True)
        done.record(self.stream)
        return NcclPending(done, self.compute)
