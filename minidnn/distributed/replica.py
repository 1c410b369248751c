"""One rank's side of a data-parallel trainer: the step's beginning and end around the executor.

``begin`` (before a mini-batch runs): on the first step, rank 0's persistent
region (parameters, BatchNorm statistics, optimizer state) and its counters
(fp16: the loss scaler's state) are broadcast; then one small all-gather gives
every rank each rank's sample count (so a rank's loss is weighted by its share of
the global batch: the gradients summed over the ranks are the global mean-loss
gradient; under fp16 the share multiplies the loss scale, and the step's scaling
is :class:`~minidnn.distributed.scaling.RankScaling`'s) and its plan's signature
(ranks whose plans would issue different BatchNorm collectives are refused
instead of deadlocking). ``end``: every bucket reduced, and the loss averaged
over the global batch.

A rank with no sample of a mini-batch (the last one, when it has fewer samples
than there are ranks) still takes part in every collective: it runs a stand-in
sample (:meth:`Replica.stand_in`) with a weight of zero, so its gradients, its
BatchNorm count and sums and its loss add nothing, and the step is what one
process takes on the real samples alone.
"""
from __future__ import annotations

import numpy as np

from ..errors import DistributedError
from .batchnorm import BatchNormSync
from .comm import CommThread
from .parallel import plan_signature
from .reduction import GradientReducer
from .scaling import RankScaling


class Replica:
    def __init__(self, parallel, trainer, global_batch):
        self.parallel, self.trainer, self.global_batch = parallel, trainer, global_batch
        self.rank, self.size = parallel.rank, parallel.size
        backend = trainer.backend
        self.comm = CommThread(parallel.comm, parallel.timeout, backend.clock)
        reduce = self.comm.allreduce
        if backend.name == "cuda":                  # gradients over NCCL; the rest over MPI
            from .nccl import NcclStream
            reduce = NcclStream(self.comm, backend).allreduce
        self.reducer = GradientReducer(reduce, trainer.store, parallel.bucket_bytes, parallel.tail_bytes)
        self.bn = BatchNormSync(self.comm, backend.to_host, backend.xp) if parallel.bn == "sync" else None
        self.synced = False
        self._signatures = {}
        self.share = 1.0

    def broadcast_state(self):
        """Rank 0's persistent region and counters (fp16: its loss scaler's too) on every rank."""
        t = self.trainer
        region = np.array(t.backend.to_host(t.store.region), copy=True)
        self.comm.bcast(region).wait()
        t.backend.write(t.store.region, region)
        state = self.comm.bcast_object({"optimizer": t.optimizer.state_dict() if t.optimizer is not None else None,
                                        "steps_done": t.steps_done,
                                        "scaler": t.scaler.state_dict() if t.scaler is not None else None})
        if t.optimizer is not None:
            t.optimizer.load_state_dict(state["optimizer"])
        if t.scaler is not None:
            t.scaler.load_state_dict(state["scaler"])
        t.steps_done = state["steps_done"]
        self.synced = True

    @staticmethod
    def stand_in(x, y):
        """What this rank runs for its slice ``x``, ``y`` of a mini-batch: the slice itself, or where it
        is empty, one zero sample of class 0 (given no weight by :meth:`begin`)."""
        if x.shape[0]:
            return x, y
        return np.zeros((1, *x.shape[1:]), x.dtype), np.zeros((1, *y.shape[1:]), y.dtype)

    def begin(self, ctx, plan, n_local):
        """Set up ``ctx`` for one mini-batch of which this rank runs ``n_local`` samples (0: it runs
        :meth:`stand_in`'s sample, with no weight)."""
        if not self.synced:
            self.broadcast_state()
        sig = self._signatures.get(id(plan))
        if sig is None:
            if self.bn is not None and _splits_batchnorm(plan):
                raise DistributedError("synchronized BatchNorm over a mini-batch split with bn='exact' is not "
                                       "supported; use bn='sub-batch' or DataParallel(bn='local')")
            sig = self._signatures[id(plan)] = (plan, plan_signature(plan) if self.bn is not None else 0)
        mine = np.array([n_local, sig[1]], np.int64)
        every = np.zeros((self.size, 2), np.int64)
        self.comm.allgather(mine, every).wait()
        if not (every[:, 1] == every[0, 1]).all():
            counts = ", ".join(f"rank {r}: {int(n)}" for r, n in enumerate(every[:, 0]))
            raise DistributedError(f"the ranks' plans differ in their BatchNorm steps (local batches {counts}); "
                                   f"use a global batch that is a multiple of {self.size} or a larger budget")
        total = int(every[:, 0].sum())
        if total == 0:
            raise DistributedError("every rank's slice of the mini-batch is empty: give each rank its slice of a "
                                   "non-empty batch (DataLoader(shard=...))")
        if total > self.global_batch:
            raise DistributedError(f"the ranks' slices add up to {total} samples, more than the global mini-batch "
                                   f"of {self.global_batch}: give each rank its slice (DataLoader(shard=...))")
        self.share = n_local / total
        ctx.sync = self.bn
        ctx.grads = self.reducer.begin()
        if ctx.scaling is not None:           # fp16: unscaled once reduced; one skip decision for every rank
            ctx.scaling = RankScaling(ctx.scaling.scaler, ctx.grads, self.comm)
            ctx.loss_scale = ctx.scaling.scale        # rank 0's, once broadcast
        ctx.loss_scale *= self.share
        if self.bn is not None:
            self.bn.log = ctx.grads.others
            self.bn.contributes = n_local > 0
        return ctx

    def end(self, ctx, loss) -> float:
        """Every bucket reduced; the global mini-batch's mean loss."""
        ctx.grads.finish()
        total = np.array([loss * self.share if self.share else 0.0])   # a stand-in's loss: none
        self.comm.allreduce(total).wait()
        return float(total[0])

    def close(self):
        """Stop this rank's communication thread (also done at exit)."""
        self.comm.close()


def _splits_batchnorm(plan) -> bool:
    """Whether ``plan`` runs BatchNorm split into its stats, combine and apply ops (``bn="exact"``),
    whose statistics are not synchronized across ranks."""
    from ..memory.subbatch import StagedPlan
    from ..ops.norm_split import BatchNormCombineOp
    return isinstance(plan, StagedPlan) and any(isinstance(n.op, BatchNormCombineOp)
                                                for n in plan.plan.schedule.graph.nodes)

