"""Sub-batching: when a mini-batch cannot fit even at the lower bound, split it.

The mini-batch of B samples runs as k sub-batches of B/k: each sub-batch's
forward and backward adds its gradients (scaled by 1/k, so they sum to the
mini-batch mean's) into the persistent gradients, and one optimizer update
follows. BatchNorm normalizes each sub-batch with its own statistics (as
moDNN does); without BatchNorm the result equals the unsplit step's up to
float rounding. Among the k that divide B and fit the budget, the planner
takes the one the simulator predicts fastest.

With exact BatchNorm (``MemoryConfig(bn="exact")``) the k sub-batches are one
graph instead (see ``split_graph``): run stage by stage between BatchNorms,
whose statistics are the full mini-batch's, then one update. That iteration is
planned as a whole like any schedule (:class:`StagedPlan`), so every buffer a
sub-batch keeps across the stages is placed, offloaded or recomputed by the
planner within the budget, and parameters and running statistics follow the
unsplit run's up to float rounding.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import MemoryBudgetError
from .config import format_bytes
from .costmodel import ProfileCost
from .planner import algorithm_options, lower_bound, minimum_bytes, plan_memory, smallest


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


@dataclass
class StagedPlan:
    """k sub-batches of ``sub_batch`` in one stage-major iteration under ``plan``, with exact BatchNorm."""

    k: int
    sub_batch: int
    plan: object         # Plan of the whole iteration: every sub-batch's forward and backward, then the update
    budget: int
    bn: str = "of the full mini-batch (exact)"

    @property
    def peak_bytes(self) -> int:
        return self.plan.peak_bytes

    @property
    def predicted_seconds(self) -> float:
        return self.plan.simulation.seconds

    def __getattr__(self, name):          # byte figures and the rest read from the iteration's plan
        if name == "plan":
            raise AttributeError(name)
        return getattr(self.plan, name)

    def summary(self, top=10) -> str:
        head = (f"sub-batching: {self.k} sub-batches of {self.sub_batch}, run stage by stage between BatchNorms "
                f"(BatchNorm statistics {self.bn}); predicted step {self.predicted_seconds * 1e3:.2f} ms; peak "
                f"{format_bytes(self.peak_bytes)} ({self.peak_bytes} B) within budget {format_bytes(self.budget)}")
        return head + "\n" + self.plan.summary(top)


def plan_staged(batch, schedule_for, sub_schedule_for, config, cost=None) -> StagedPlan:
    """The fastest feasible split of a ``batch``-sample mini-batch with exact BatchNorm statistics.

    ``schedule_for(k)`` returns the stage-major schedule of the whole iteration
    as k sub-batches; ``sub_schedule_for(b)`` the schedule of one sub-batch of b,
    whose lower bound (the staged iteration's is at least as high) rules out a
    k without planning it. Raises MemoryBudgetError with the minimum at
    sub-batches of 1 sample when none fits.
    """
    budget = config.budget
    best = None
    for k in (k for k in range(2, batch + 1) if batch % k == 0):
        sub = sub_schedule_for(batch // k)
        options = algorithm_options(sub, cost or ProfileCost(config.profile)) if config.algorithms == "auto" else {}
        bound = lower_bound(sub, smallest(options))
        if budget is not None and bound > budget:
            continue
        try:
            plan = StagedPlan(k, batch // k, plan_memory(schedule_for(k), config, cost), budget)
        except MemoryBudgetError:
            continue
        if best is not None and plan.predicted_seconds >= best.predicted_seconds:
            break        # more sub-batches only add overhead, and the schedule (and its planning) grows with k
        best = plan
    if best is None:     # the least the planner needs with sub-batches of 1 (one planning pass, no search)
        least = minimum_bytes(schedule_for(batch), config, cost)
        raise MemoryBudgetError(f"budget {format_bytes(budget)} ({budget} B) is below the minimum feasible "
                                f"{format_bytes(least)} ({least} B) with exact BatchNorm statistics, even with "
                                f"sub-batches of 1 sample", least, budget)
    return best
