"""``DataParallel``: what makes ``minidnn.compile`` train one model over several processes.

    dp = mdn.distributed.DataParallel()            # MPI.COMM_WORLD, under mpiexec
    trainer = mdn.compile(net, (64, 3, 32, 32), loss, opt, parallel=dp)
    for x, y in DataLoader(data, 64, shard=dp.shard_of):   # this rank's slice of each batch
        trainer.step(x, y)

``input_shape``'s batch is the *global* mini-batch: each rank compiles and
runs its slice (:func:`shard_range`), the gradients are the global batch's mean
gradient and BatchNorm takes the global batch's statistics (``bn="sync"``; or
each rank its own, ``bn="local"``), so the number of ranks does not change
what is trained. Rank 0's parameters, buffers and optimizer state are
broadcast before the first step, and a configuration that differs across
ranks is refused at compile time, naming the difference and the ranks. What
changes the training outside the trainer (the data, the loader's seed and
augmentation, the learning-rate schedule, the epochs) is compared with
:meth:`DataParallel.require_same`, as ``minidnn train`` does before it compiles.
"""
from __future__ import annotations

import json
import zlib

import numpy as np

from ..errors import DistributedError
from .comm import TIMEOUT_SECONDS


def shard_range(n, rank, size) -> tuple:
    """The rows ``[lo, hi)`` of a batch of ``n`` that rank ``rank`` of ``size`` takes: contiguous,
    in rank order, the first ``n % size`` ranks one row more."""
    q, r = divmod(int(n), int(size))
    lo = rank * q + min(rank, r)
    return lo, lo + q + (rank < r)


class DataParallel:
    """Data-parallel training over the MPI communicator ``comm`` (default ``MPI.COMM_WORLD``).

    ``bn``: ``"sync"`` (BatchNorm statistics over the global mini-batch, the
    meaning of one process) or ``"local"`` (each rank's own slice, as PyTorch
    DDP by default). ``bucket_bytes``/``tail_bytes``: the gradient buckets'
    sizes (default: :func:`minidnn.distributed.buckets.bucket_sizes`). ``timeout``: seconds a
    collective may wait for the other ranks before failing with a
    :class:`~minidnn.errors.DistributedError` that names the rank (work one rank does alone
    between two steps, such as rank 0 writing a checkpoint, must take less).

    Where the budget splits the mini-batch into sub-batches (BatchNorm per sub-batch, an
    opt-in that changes the math), a synchronized BatchNorm's statistics are those of the
    ranks' j-th sub-batches together; a split with ``bn="exact"`` is refused.

    Under mixed precision (``compile(precision="bf16"|"fp16")``, the same on every rank) the
    buckets hold the fp32 master gradients and are reduced in fp32, as DDP's under autocast,
    synchronized BatchNorm combines fp32 statistics in float64, and fp16's loss scaler unscales
    the reduced gradients and takes one skip decision for every rank
    (:mod:`minidnn.distributed.scaling`), so every rank keeps rank 0's scale.
    """

    def __init__(self, comm=None, bn="sync", bucket_bytes=None, tail_bytes=None, timeout=TIMEOUT_SECONDS):
        if bn not in ("sync", "local"):
            raise ValueError(f"DataParallel: bn must be 'sync' or 'local', got {bn!r}")
        if comm is None:
            try:
                from mpi4py import MPI
            except ImportError as e:
                raise DistributedError(f"data-parallel training needs mpi4py ({e}): pip install 'minidnn[mpi]'") \
                    from None
            comm = MPI.COMM_WORLD
        self.comm, self.bn = comm, bn
        self.bucket_bytes, self.tail_bytes, self.timeout = bucket_bytes, tail_bytes, float(timeout)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.members = []                  # (pid, host) of each rank, once attached

    def device(self, device):
        """What to pass as ``compile(device=...)`` on this rank: for ``"cuda"``, a CUDA backend on
        this rank's GPU (the ranks of one machine take its GPUs in turn); anything else as it is."""
        if device != "cuda":
            return device
        node = self.comm.Split_type(_shared_memory(), key=self.rank)
        try:
            local = node.Get_rank()
        finally:
            node.Free()
        from ..backend.cuda import create
        from ..backend.cuda.loader import require
        require()                                 # BackendUnavailable, naming what is missing
        from .nccl import device_count
        return create(device=local % device_count())

    @property
    def shard_of(self) -> tuple:
        """(rank, size), as ``DataLoader(shard=...)`` takes it."""
        return self.rank, self.size

    def local_shape(self, global_shape) -> tuple:
        """This rank's slice of a global input shape (batch first)."""
        lo, hi = shard_range(global_shape[0], self.rank, self.size)
        if hi == lo:
            raise DistributedError(f"a global batch of {global_shape[0]} leaves rank {self.rank} of "
                                   f"{self.size} no sample; use a batch of at least {self.size}")
        return (hi - lo,) + tuple(global_shape[1:])

    def describe(self) -> dict:
        return {"ranks": self.size, "batchnorm": self.bn, "bucket bytes": self.bucket_bytes,
                "tail bytes": self.tail_bytes}

    def require_same(self, settings: dict):
        """A :class:`~minidnn.errors.DistributedError` on every rank unless every rank passed equal
        ``settings`` (picklable values, such as :func:`minidnn.data.fingerprint` of the data, the
        loader's seed and augmentation, the schedule and the epochs), naming the first setting that
        differs, the ranks and their values. A collective: every rank calls it at the same point."""
        check_same(self.comm, settings)

    def attach(self, trainer, schedule, global_shape):
        """Check that every rank compiled the same thing, then start this rank's communication."""
        from .replica import Replica
        self.members = check_same(self.comm, configuration(trainer, schedule, global_shape, self))
        return Replica(self, trainer, global_shape[0])

    def describe_members(self) -> str:
        """Who the ranks are (a launcher that reports a failed process names its pid)."""
        return ", ".join(f"rank {r}: pid {pid} on {host}" for r, (pid, host) in enumerate(self.members))


def _shared_memory():
    from mpi4py import MPI
    return MPI.COMM_TYPE_SHARED


def configuration(trainer, schedule, global_shape, parallel) -> dict:
    """What must be equal on every rank, as JSON-able values."""
    from .. import __version__
    graph = schedule.graph
    # the shapes without the batch: ranks whose slices differ in size trace the same model
    structure = [(n.label, n.op.name, [list(o.shape[1:]) for o in n.outputs]) for n in graph.nodes]
    params = [(p.qualname, list(p.data.shape)) for p in trainer.net.parameters()]
    model = zlib.crc32(json.dumps([structure, params]).encode())
    mem = trainer.memory
    stream = zlib.crc32(json.dumps(trainer.rng.bit_generator.state, sort_keys=True).encode())
    norm = trainer.normalization
    return {"minidnn version": __version__, "global batch": list(global_shape), "dtype": str(trainer.dtype),
            "precision": trainer.precision.name,
            "random stream (compile's seed)": f"{stream:08x}",
            "input normalization": json.dumps(norm.to_dict()) if norm is not None else "none",
            "model": f"{len(graph.nodes)} ops, {len(params)} parameters, structure {model:08x}",
            "device": trainer.backend.name,
            "memory budget": repr(mem.budget), "memory policy": repr(mem.policy), "profile": repr(mem.profile),
            "algorithms": mem.algorithms, "sub-batching": repr(mem.sub_batching), "split BatchNorm": mem.bn,
            "optimizer": f"{type(trainer.optimizer).__name__} {json.dumps(trainer.optimizer.state_dict())}"
            if trainer.optimizer is not None else "none", **parallel.describe()}


def check_same(comm, config) -> list:
    """DistributedError on every rank if any rank's ``config`` differs from rank 0's (:func:`differences`);
    else each rank's (pid, host name)."""
    import os
    import socket
    dup = comm.Dup()
    try:
        gathered = dup.allgather((config, (os.getpid(), socket.gethostname())))
    finally:
        dup.Free()
    problem = differences([c for c, _ in gathered])
    if problem:
        raise DistributedError(problem)
    return [who for _, who in gathered]


def differences(configs) -> str:
    """Where the ranks' ``configs`` (dicts, in rank order) differ from rank 0's: the first such key, each rank
    that differs in it with its value, and the other keys that differ; "" where none does."""
    keys = list(dict.fromkeys(k for c in configs for k in c))
    differ = [k for k in keys if any(c.get(k, _ABSENT) != configs[0].get(k, _ABSENT) for c in configs[1:])]
    if not differ:
        return ""
    key = differ[0]
    values = [c.get(key, _ABSENT) for c in configs]
    ranks = [r for r, v in enumerate(values) if v != values[0]]
    text = f"rank {ranks[0]}'s {key} differs from rank 0's: {values[ranks[0]]} != {values[0]}"
    if len(ranks) > 1:
        text += " (and " + ", ".join(f"rank {r}'s: {values[r]}" for r in ranks[1:]) + ")"
    if len(differ) > 1:
        text += f"; also different: {', '.join(differ[1:])}"
    return text


_ABSENT = "(not set)"       # a key one rank has and another lacks (different versions)


def plan_signature(plan) -> int:
    """A number that differs where two ranks' plans would issue different BatchNorm collectives
    (the order the communication thread runs them in)."""
    from ..memory.subbatch import StagedPlan, SubBatchPlan
    from ..ops.norm import BatchNorm2dOp
    if isinstance(plan, SubBatchPlan):
        programs = [plan.sub.program] * plan.k + [plan.update.program]
    elif isinstance(plan, StagedPlan):
        programs = [plan.plan.program]
    else:
        programs = [plan.program]
    marks = [(s.kind, s.label) for prog in programs for s in prog.steps
             if s.node is not None and isinstance(s.node.op, BatchNorm2dOp) and s.node.op.training]
    return zlib.crc32(json.dumps(marks).encode()) & 0x7FFFFFFF


def agree(values: np.ndarray) -> bool:
    return bool((values == values[0]).all())
