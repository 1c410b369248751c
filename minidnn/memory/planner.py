"""Planners: pure functions from a schedule and a budget to a Plan."""
from __future__ import annotations

from ..errors import MemoryBudgetError
from . import liveness, placement
from .config import MemoryConfig, format_bytes
from .plan import Plan


def plan_resident(schedule, budget=None, policy="none") -> Plan:
    """Everything stays on the device; dead buffers are reused (liveness only)."""
    spans = liveness.intervals(schedule)
    sizes = {t: schedule.tensor(t).nbytes for t in spans}
    offsets = placement.place(spans, sizes)
    curve = liveness.live_bytes(sizes, spans, len(schedule.steps))
    persistent = schedule.persistent_bytes
    return Plan(schedule=schedule, steps=schedule.steps, spans=spans, offsets=offsets, sizes=sizes,
                persistent_bytes=persistent, arena_bytes=placement.peak(offsets, sizes),
                ideal_bytes=persistent + sum(sizes.values()),
                liveness_peak_bytes=persistent + int(curve.max(initial=0)),
                live_curve=curve.tolist(), budget=budget, policy=policy)


def plan_memory(schedule, config: MemoryConfig = None) -> Plan:
    """The plan for ``schedule`` under ``config``'s budget, or MemoryBudgetError."""
    config = config or MemoryConfig()
    plan = plan_resident(schedule)
    budget = config.resolve(plan.liveness_peak_bytes)
    plan.budget = budget
    if budget is not None and plan.peak_bytes > budget:
        at = max(range(len(plan.live_curve)), key=plan.live_curve.__getitem__)
        raise MemoryBudgetError(
            f"budget {format_bytes(budget)} is below the minimum feasible {format_bytes(plan.peak_bytes)} "
            f"({plan.peak_bytes} B), set by step {at} ({plan.steps[at].label})", plan.peak_bytes)
    return plan
