"""Sub-batching: when a mini-batch cannot fit even at the lower bound, split it.

The mini-batch of B samples runs as k sub-batches of B/k: each sub-batch's
forward and backward adds its gradients (scaled by 1/k, so they sum to the
mini-batch mean's) into the persistent gradients, and one optimizer update
follows. BatchNorm normalizes each sub-batch with its own statistics (as
moDNN does); without BatchNorm the result equals the unsplit step's up to
float rounding. Among the k that divide B and fit the budget, the planner
takes the one the simulator predicts fastest.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import MemoryBudgetError
from .config import format_bytes
from .planner import plan_memory


@dataclass
class SubBatchPlan:
    """k sub-batches of ``sub_batch`` samples under ``sub``, then ``update`` once."""

    k: int
    sub_batch: int
    sub: object          # Plan of one sub-batch's forward + backward (gradients accumulate)
    update: object       # Plan of the optimizer update alone
    budget: int
    bn: str = "per sub-batch"

    @property
    def peak_bytes(self) -> int:
        return max(self.sub.peak_bytes, self.update.peak_bytes)

    @property
    def persistent_bytes(self) -> int:
        return self.sub.persistent_bytes

    @property
    def predicted_seconds(self) -> float:
        return self.k * self.sub.simulation.seconds + self.update.simulation.seconds

    def __getattr__(self, name):          # byte figures and the rest read from the sub-batch plan
        if name in ("sub", "update"):
            raise AttributeError(name)
        return getattr(self.sub, name)

    def summary(self, top=10) -> str:
        head = (f"sub-batching: {self.k} sub-batches of {self.sub_batch} (BatchNorm statistics {self.bn}); "
                f"predicted step {self.predicted_seconds * 1e3:.2f} ms; peak {format_bytes(self.peak_bytes)} "
                f"({self.peak_bytes} B) within budget {format_bytes(self.budget)}")
        return head + "\n" + self.sub.summary(top)


def plan_sub_batches(batch, schedules_for, config, cost=None) -> SubBatchPlan:
    """The fastest feasible split of a ``batch``-sample mini-batch under ``config.budget`` (bytes).

    ``schedules_for(b)`` returns (sub-batch schedule with accumulating gradients,
    update-only schedule) for sub-batches of ``b`` samples. Raises
    MemoryBudgetError with the minimum at sub-batch 1 when no split fits.
    """
    budget = config.budget
    best, tried_after = None, 0
    for k in (k for k in range(2, batch + 1) if batch % k == 0):
        if best is not None and tried_after >= 2:     # more sub-batches only add per-step overhead
            break
        sub_sched, upd_sched = schedules_for(batch // k)
        try:
            sub = plan_memory(sub_sched, config, cost)
            upd = plan_memory(upd_sched, config, cost)
        except MemoryBudgetError:
            continue
        plan = SubBatchPlan(k, batch // k, sub, upd, budget)
        if best is not None:
            tried_after += 1
        if best is None or plan.predicted_seconds < best.predicted_seconds:
            best = plan
    if best is None:                       # the smallest split's errors name the minimum and its step
        sub_sched, upd_sched = schedules_for(1)
        errors = []
        for sched in (sub_sched, upd_sched):
            try:
                plan_memory(sched, config, cost)
            except MemoryBudgetError as e:
                errors.append(e)
        worst = max(errors, key=lambda e: e.minimum_bytes)
        raise MemoryBudgetError(f"{worst}, even with sub-batches of 1 sample", worst.minimum_bytes, budget)
    return best
