"""Data-parallel training: several processes train one model on disjoint slices of each
global mini-batch (:class:`DataParallel`). MPI (mpi4py) is imported only where a
communicator is made, CuPy only on the NCCL path."""
from .buckets import Bucket, gradient_buckets
from .launch import launched
from .parallel import DataParallel, shard_range

__all__ = ["DataParallel", "shard_range", "launched", "Bucket", "gradient_buckets"]
