"""fp16's loss scaling on data-parallel ranks: one skip decision and one scale on every rank.

Under DDP, torch's GradScaler unscales gradients that are already all-reduced, so
every rank finds the same inf/NaN and skips the same steps. Here the same holds
by construction: :class:`RankScaling` waits for every gradient bucket's reduction
before it unscales (the executor unscales before the first update, which would
otherwise wait for its own bucket only, and the unscaling multiplies the buckets
in place), then sums every rank's inf/NaN flag. The flag's reduction makes the
decision one even where the ranks' findings differ (a rank whose loss alone was
inf, an all-reduce that did not give every rank the same bits), so no rank ever
updates while another skips. With every rank starting from rank 0's scaler state
(:meth:`Replica.broadcast_state`) and taking the same decisions, the scale is the
same on every rank after every step.
"""
from __future__ import annotations

import numpy as np

from ..grad_scaler import StepScaling


class RankScaling(StepScaling):
    """One step's loss scaling on one rank of ``comm`` (a CommThread), whose gradient buckets are
    reduced by ``reduction`` (the step's :class:`~minidnn.distributed.reduction.Reduction`)."""

    def __init__(self, scaler, reduction, comm):
        super().__init__(scaler)
        self.reduction, self.comm = reduction, comm

    def unscale(self, xp, grads):
        self.reduction.finish()           # the global gradients: what every rank would update with
        super().unscale(xp, grads)

    def agree(self, found_inf: bool) -> bool:
        flag = np.array([1 if found_inf else 0], np.int64)
        t0 = self.comm.clock()
        pending = self.comm.allreduce(flag)
        pending.wait()
        self.reduction.others.append(("loss scaler's inf/NaN flag", flag.nbytes, pending, (t0, self.comm.clock())))
        return bool(flag[0])
