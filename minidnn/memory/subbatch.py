"""Splitting a step: the decision to split, and the plans of a split step.

A training step that cannot fit at its full batch of B samples (or, with
``sub_batching="fastest"``, the default, one that is predicted faster split than
evicting, where the split keeps the step's meaning) runs as k sub-batches of B/k, whose 1/k-scaled gradients add up to the
mini-batch mean's before one optimizer update. :func:`plan_step` makes that
decision and returns one of three plans, all with one interface (``k``,
``sub_batch``, ``peak_bytes``, ``predicted_seconds``, ``budget``,
``summary()``, ``labels``, ``classes``, ``batch_norm_updates`` and
``run(executor, ctx, x, y, optimizer, t, recorder)``):

- a whole :class:`~minidnn.memory.plan.Plan` (k = 1);
- a :class:`StagedPlan`, the default split of a network with a training-mode
  BatchNorm: the k sub-batches are one graph (``split_graph``), run stage by
  stage between BatchNorms, whose statistics are the full mini-batch's, as the
  unsplit step's. That iteration is planned as a whole like any schedule, so
  every buffer a sub-batch keeps across the stages is placed, offloaded or
  recomputed within the budget; parameters and running statistics follow the
  unsplit run's up to float rounding, and the running statistics move once;
- a :class:`SubBatchPlan`: k runs of one sub-batch's plan, then the update's.
  Without BatchNorm in training mode that is the unsplit step up to float
  rounding. With one, each sub-batch normalizes with its own statistics
  (moDNN's semantics) and moves the running statistics once: only on request,
  ``MemoryConfig(bn="sub-batch")``, and named in the summary.

An eval pass has no gradients to add up: eval-mode BatchNorm normalizes each
sample alone, so :func:`plan_eval` splits a batch that does not fit into
chunks (:class:`ChunkedPlan`) whose outputs, concatenated, are each chunk's
own pass's bit for bit (and the whole batch's up to a kernel's summation order,
which may depend on how many samples it gets).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from ..errors import MemoryBudgetError, ShapeError
from ..graph import Spec
from ..ops.norm import BatchNorm2dOp
from ..schedule import PARAM_GRAD
from ..trace import SplitRecording
from .config import format_bytes
from .costmodel import CachedCost, ProfileCost
from .knobs import Knobs
from .planner import algorithm_options, lower_bound, minimum_bytes, plan_memory, smallest, unlimited_seconds


@dataclass(frozen=True)
class Splits:
    """How to build the schedules of a split step of one network (the caller knows the network).

    ``sub(b)``: (one sub-batch of b samples, forward and backward adding its
    gradients; the optimizer update alone). ``staged(b, k)``: the stage-major
    iteration of k sub-batches of b with full-batch BatchNorm statistics.
    """

    sub: Callable
    staged: Callable


def _divisors(batch):
    return [k for k in range(2, batch + 1) if batch % k == 0]


def trains_batch_norm(schedule) -> bool:
    """Whether ``schedule``'s graph has a BatchNorm in training mode (whose statistics a split would change)."""
    return any(isinstance(n.op, BatchNorm2dOp) and n.op.training for n in schedule.graph.nodes)


def plan_step(schedule, config, cost=None, splits=None, whole_cost=None, knobs: Knobs = Knobs()):
    """The plan of the training step ``schedule`` under ``config``: whole, or split (see the module).

    A step is split when it does not fit whole and ``config.sub_batching`` and
    ``splits`` allow it, or with ``sub_batching="fastest"`` (the default) when the
    split is predicted faster than the whole plan's evictions and keeps the step's
    meaning (full-batch BatchNorm statistics, or no training-mode BatchNorm): a
    tighter budget, at which the whole step no longer fits, is then never planned
    slower for having had to split while a looser one evicts.
    ``whole_cost`` (measured times of the full step, if any) plans the whole
    step; the split is then not compared with it, its times being of another
    kind. A fractional budget is resolved against the whole step's liveness
    peak; every plan returned carries it in bytes (``budget``).
    """
    batch = schedule.tensor(schedule.inputs[0]).spec.shape[0]
    # policy "none" evicts nothing, and splitting is a way to evict: it answers with its own peak
    splittable = bool(config.sub_batching) and splits is not None and batch > 1 and config.policy != "none"
    try:
        whole = plan_memory(schedule, config, whole_cost or cost)
    except MemoryBudgetError as e:
        if not splittable:
            raise
        split = split_step(batch, trains_batch_norm(schedule), splits, replace(config, budget=e.budget_bytes), cost)
        return replace(split, unsplit_seconds=unlimited_seconds(schedule, config, cost))
    batch_norm = trains_batch_norm(schedule)
    if (config.sub_batching != "fastest" or not splittable or not whole.predicted_overhead
            or whole_cost is not None or (batch_norm and config.bn != "exact")):
        return whole
    largest = None if knobs.split_trial_steps is None else knobs.split_trial_steps // len(schedule.steps)
    try:
        split = split_step(batch, batch_norm, splits, replace(config, budget=whole.budget), cost,
                           bar=whole.predicted_seconds, largest=largest)
    except (MemoryBudgetError, ShapeError):      # no split fits, or the graph cannot be split exactly
        return whole
    if split is None or split.predicted_seconds >= whole.predicted_seconds:
        return whole
    return replace(split, unsplit_seconds=whole.baseline.seconds, whole_seconds=whole.predicted_seconds)


def split_step(batch, batch_norm, splits, config, cost=None, bar=None, largest=None):
    """The fastest feasible split of a ``batch``-sample step under ``config.budget`` (bytes): staged where
    a training-mode BatchNorm must keep the full batch's statistics, else sub-batch by sub-batch.
    ``bar``: the seconds of a plan the split must beat (the whole step's), where there is one;
    ``largest``: the most sub-batches a staged split is planned with (None: any)."""
    if batch_norm and config.bn == "exact":
        return plan_staged(batch, lambda k: splits.staged(batch // k, k), lambda b: splits.sub(b)[0], config, cost,
                           bar=bar, largest=largest)
    return plan_sub_batches(batch, splits.sub, config, cost,
                            bn="per sub-batch (moDNN's; bn='sub-batch')" if batch_norm else None)


def _scaled(spec, k):
    return Spec((spec.shape[0] * k,) + tuple(spec.shape[1:]), spec.dtype)


class _Split:
    """What a split step reports against the step it splits: ``unsplit_seconds``, the whole step's
    predicted time with unlimited memory (None where not known), is what its overhead is relative to;
    ``whole_seconds``, where the whole step fits too, is its plan's (the summary says why the split)."""

    @property
    def predicted_overhead(self):
        """The split step's predicted time relative to the unsplit step with unlimited memory, minus one."""
        return self.predicted_seconds / self.unsplit_seconds - 1 if self.unsplit_seconds else None

    @property
    def unlimited_seconds(self):
        return self.unsplit_seconds

    def _against_unsplit(self) -> str:
        over = self.predicted_overhead
        text = (f" ({over * 100:+.1f}% vs {self.unsplit_seconds * 1e3:.2f} ms, the unsplit step with unlimited "
                f"memory)" if over is not None else " (the unsplit step's time with unlimited memory is not known)")
        if self.whole_seconds is not None:      # split where the whole step fits: what it would have been
            text += f", split because faster than the whole step, which fits at {self.whole_seconds * 1e3:.2f} ms"
            if self.unsplit_seconds:
                text += f" ({(self.whole_seconds / self.unsplit_seconds - 1) * 100:+.1f}%)"
        return text


@dataclass
class SubBatchPlan(_Split):
    """k sub-batches of ``sub_batch`` under ``sub``, then ``update`` once."""

    k: int
    sub_batch: int
    sub: object          # Plan of one sub-batch's forward + backward (gradients accumulate)
    update: object       # Plan of the optimizer update alone
    budget: int
    bn: str = None       # whose statistics a training-mode BatchNorm uses (None: the network has none)
    unsplit_seconds: float = None
    whole_seconds: float = None      # the whole step's plan where it fits too (the split is faster)

    @property
    def peak_bytes(self) -> int:
        return max(self.sub.peak_bytes, self.update.peak_bytes)

    @property
    def persistent_bytes(self) -> int:
        return self.sub.persistent_bytes

    @property
    def predicted_seconds(self) -> float:
        return self.k * self.sub.simulation.seconds + self.update.simulation.seconds

    @property
    def labels(self) -> Spec:
        return _scaled(self.sub.labels, self.k)

    @property
    def classes(self):
        return self.sub.classes

    @property
    def batch_norm_updates(self) -> int:
        """Each sub-batch's forward moves the running statistics (the network's counters follow)."""
        return self.k

    def __getattr__(self, name):          # byte figures and the rest read from the sub-batch plan
        if name in ("sub", "update", "unsplit_seconds"):
            raise AttributeError(name)
        return getattr(self.sub, name)

    def run(self, executor, ctx, x, y, optimizer=None, t=0, recorder=None, txn=None) -> float:
        """k sub-batches adding their gradients, then one update; the loss is their mean. A recorded
        step is traced whole: every sub-batch, then the update, as one iteration."""
        for tensor in self.sub.schedule.tensors:
            if tensor.category == PARAM_GRAD:
                executor.store.view(tensor)[...] = 0
        ctx.loss_scale /= self.k
        losses, high, b = [], 0, self.sub_batch
        grads = ctx.grads                           # data-parallel: reduced once, in the last sub-batch
        rec, parts = SplitRecording(recorder, t), runs(self)
        for j, (name, sub) in enumerate(parts[:-1]):
            ctx.grads = grads if j == self.k - 1 else None
            losses.append(sub.run(executor, ctx, x[j * b:(j + 1) * b], y[j * b:(j + 1) * b], None, t,
                                  rec.part(name, len(sub.steps)), txn))
            high = max(high, executor.high_water_bytes)
        name, update = parts[-1]
        executor.run(update, ctx, [], optimizer, t, recorder=rec.part(name, len(update.steps)), txn=txn)
        executor.high_water_bytes = max(high, executor.high_water_bytes)
        rec.end(self.peak_bytes, self.budget, self.predicted_seconds, self.unsplit_seconds)
        return float(np.mean(losses))

    def summary(self, top=10) -> str:
        """The whole step (k sub-batches, then the update) against the unsplit step with unlimited
        memory, then the plan of one sub-batch, whose figures are that run's."""
        bn = f" (BatchNorm statistics {self.bn})" if self.bn else ""
        sub, upd = self.sub.simulation.seconds, self.update.simulation.seconds
        head = (f"sub-batching: {self.k} sub-batches of {self.sub_batch}{bn}, then the update; "
                f"predicted step {self.predicted_seconds * 1e3:.2f} ms = {self.k} x {sub * 1e3:.2f} ms + update "
                f"{upd * 1e3:.2f} ms{self._against_unsplit()}; peak {format_bytes(self.peak_bytes)} "
                f"({self.peak_bytes} B) within budget {format_bytes(self.budget)}")
        return head + "\n" + self.sub.summary(top, run=f"one sub-batch of {self.sub_batch}")


def plan_sub_batches(batch, schedules_for, config, cost=None, bn=None) -> SubBatchPlan:
    """The fastest feasible split of a ``batch``-sample mini-batch under ``config.budget`` (bytes).

    ``schedules_for(b)`` returns (sub-batch schedule with accumulating gradients,
    update-only schedule) for sub-batches of ``b`` samples; ``bn`` names the
    BatchNorm semantics for the summary. Raises MemoryBudgetError with the
    minimum at sub-batch 1 when no split fits.
    """
    budget = config.budget
    best, tried_after = None, 0
    for k in _divisors(batch):
        if best is not None and tried_after >= 2:     # more sub-batches only add per-step overhead
            break
        sub_sched, upd_sched = schedules_for(batch // k)
        try:
            sub = plan_memory(sub_sched, config, cost)
            upd = plan_memory(upd_sched, config, cost)
        except MemoryBudgetError:
            continue
        plan = SubBatchPlan(k, batch // k, sub, upd, budget, bn)
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
class StagedPlan(_Split):
    """k sub-batches of ``sub_batch`` in one stage-major iteration under ``plan``, with exact BatchNorm."""

    k: int
    sub_batch: int
    plan: object         # Plan of the whole iteration: every sub-batch's forward and backward, then the update
    budget: int
    bn: str = "of the full mini-batch (exact)"
    unsplit_seconds: float = None
    # (k, its floor) of each larger split not planned: its floor (compute_floor) is no faster than this plan
    not_planned: tuple = ()
    whole_seconds: float = None      # the whole step's plan where it fits too (the split is faster)
    batch_norm_updates = 1           # the combine moves the running statistics once, with the full batch's

    @property
    def peak_bytes(self) -> int:
        return self.plan.peak_bytes

    @property
    def predicted_seconds(self) -> float:
        return self.plan.simulation.seconds

    @property
    def labels(self) -> Spec:
        return _scaled(self.plan.labels, self.k)

    def __getattr__(self, name):          # byte figures and the rest read from the iteration's plan
        if name in ("plan", "unsplit_seconds"):
            raise AttributeError(name)
        return getattr(self.plan, name)

    def run(self, executor, ctx, x, y, optimizer=None, t=0, recorder=None, txn=None) -> float:
        """The iteration on every sub-batch's samples and labels (its inputs, sub-batch by sub-batch)."""
        b = self.sub_batch
        feeds = [a for j in range(self.k) for a in (x[j * b:(j + 1) * b], y[j * b:(j + 1) * b])]
        (name, plan), = runs(self)
        rec = SplitRecording(recorder, t)        # the trace carries the whole step's predictions
        out = executor.run(plan, ctx, feeds, optimizer, t, recorder=rec.part(name, len(plan.steps)), txn=txn)
        rec.end(self.peak_bytes, self.budget, self.predicted_seconds, self.unsplit_seconds)
        return float(out[plan.schedule.loss])

    def summary(self, top=10) -> str:
        head = (f"sub-batching: {self.k} sub-batches of {self.sub_batch}, run stage by stage between BatchNorms "
                f"(BatchNorm statistics {self.bn}); predicted step {self.predicted_seconds * 1e3:.2f} ms"
                f"{self._against_unsplit()}; peak "
                f"{format_bytes(self.peak_bytes)} ({self.peak_bytes} B) within budget {format_bytes(self.budget)}")
        return head + "\n" + self.plan.summary(top, run=f"the staged iteration of {self.k} sub-batches")


def compute_floor(schedule, config, cost=None) -> float:
    """Seconds that no plan of ``schedule`` under ``config`` is predicted faster than: every step once,
    each at its fastest algorithm (or its own, where that is faster), added in the schedule's order.

    A plan runs every schedule step once, with its own algorithm or one of the options, in the
    schedule's order; the simulator adds each step's seconds to the compute stream's clock, and what
    else it does (recomputations, copies' shares, waits) only moves that clock later. Floating-point
    addition is monotone in each operand, so a plan's predicted time is at least this sum computed in
    the same order (tests/test_planning_time_staged.py)."""
    cost = CachedCost(cost or ProfileCost(config.profile))
    options = algorithm_options(schedule, cost, pinned=config.algorithms != "auto")
    total = 0.0
    for s in schedule.steps:
        total += min([cost.step_seconds(schedule, s, None)] + [secs for secs, _ in options.get(s.index, ())])
    return total


def plans(schedule, config, cost=None) -> bool:
    """Whether ``plan_memory(schedule, config, cost)`` is sure to return a plan rather than raise:
    under the ``auto`` policy it returns one wherever the least it can need (minimum_bytes: the
    minimum plan, or evicting nothing where that needs less) is within the budget (in bytes)."""
    budget = config.budget
    if budget is None:
        return True
    if not isinstance(budget, (int, np.integer)) or isinstance(budget, bool) or config.policy_object().name != "auto":
        return False
    return minimum_bytes(schedule, config, cost) <= budget


def plan_staged(batch, schedule_for, sub_schedule_for, config, cost=None, floors=True,
                knobs: Knobs = Knobs(), bar=None, largest=None) -> StagedPlan | None:
    """The fastest feasible split of a ``batch``-sample mini-batch with exact BatchNorm statistics.

    ``schedule_for(k)`` returns the stage-major schedule of the whole iteration
    as k sub-batches; ``sub_schedule_for(b)`` the schedule of one sub-batch of b,
    whose lower bound (the staged iteration's is at least as high) rules out a
    k without planning it (a k whose sub-batch a layer refuses, as BatchNorm1d
    refuses one sample, is not a split). Raises MemoryBudgetError with the
    minimum at the smallest sub-batch when none fits.

    k = 2, 4, ... are planned in turn until one is no faster than the best before it. With
    ``floors``, a k whose :func:`compute_floor` is no faster than the best and that is sure to
    find a plan (:func:`plans`) ends the search unplanned: planned, it would have ended it too
    (the plan is the same; the k is in the plan's ``not_planned``).

    The k are compared by plans of a lighter search (``knobs.split_choice_seed_steps``); the k
    chosen is planned again with ``knobs`` where that search is not the same, and keeps the
    faster of its two plans.

    ``bar``: the seconds of another plan of the step (the whole step's, which fits). A k whose
    compute floor is no faster than it is not planned, the k chosen is planned again only where
    its lighter plan beats it, and None is returned where no split is predicted faster; ``largest``
    bounds k (Knobs.split_trial_steps). (The bar
    does not end the search as a better split would: at 22% of ResNet-50's liveness peak on
    a100-40gb, 2 sub-batches are slower than the whole step and 4 faster.)
    """
    budget = config.budget
    choice = knobs if knobs.split_choice_seed_steps is None else \
        replace(knobs, baseline_seed_steps=min(knobs.baseline_seed_steps, knobs.split_choice_seed_steps),
                hidden_chain_seed=True)
    best, smallest_split, refused = None, None, None
    for k in _divisors(batch):
        if largest is not None and k > largest:
            break
        try:            # a layer may refuse sub-batches of few samples (BatchNorm1d on (N, C) needs 2)
            sub = sub_schedule_for(batch // k)
        except ShapeError as e:
            refused = refused or e
            continue
        smallest_split = k
        options = algorithm_options(sub, cost or ProfileCost(config.profile)) if config.algorithms == "auto" else {}
        bound = lower_bound(sub, smallest(options))
        if budget is not None and bound > budget:
            continue
        try:
            schedule = schedule_for(k)
            floor = compute_floor(schedule, config, cost) if (best is not None or bar is not None) and floors else None
            if floor is not None and bar is not None and floor >= bar:
                # no plan of k beats the bar, nor of a larger k: a profile's floor grows with k (each step
                # a roofline plus a launch: k max(F/k, A/k + W) + k o = max(F, A + k W) + k o)
                break
            if floor is not None and best is not None and floor >= best.predicted_seconds \
                    and plans(schedule, config, cost):
                # planning k would find a plan, no faster than the best: the loop would end there
                best = replace(best, not_planned=((k, floor),))
                break
            plan = StagedPlan(k, batch // k, plan_memory(schedule, config, cost, choice), budget)
        except MemoryBudgetError:
            continue
        if best is not None and plan.predicted_seconds >= best.predicted_seconds:
            break        # more sub-batches only add overhead, and the schedule (and its planning) grows with k
        best, best_schedule = plan, schedule
    if bar is not None and (best is None or best.predicted_seconds >= bar):
        return None
    if best is not None and len(best_schedule.steps) <= knobs.baseline_seed_steps and choice != knobs:
        full = plan_memory(best_schedule, config, cost, knobs)      # fits: a search of more seeds and repairs
        if full.predicted_seconds < best.predicted_seconds:
            best = replace(best, plan=full)
    if best is None and smallest_split is None:
        raise refused
    if best is None:     # the least the planner needs at the smallest sub-batch (one planning pass, no search)
        least = minimum_bytes(schedule_for(smallest_split), config, cost)
        samples = batch // smallest_split
        policy = config.policy_object().name
        if budget is not None and least <= budget:     # the planner reaches the budget: the policy does not
            raise MemoryBudgetError(f"the {policy!r} policy finds no plan within {format_bytes(budget)} ({budget} B), "
                                    f"whole or split into sub-batches with exact BatchNorm statistics; the "
                                    f"planner's own minimum is {format_bytes(least)} ({least} B) with sub-batches "
                                    f"of {samples} sample{'s' if samples > 1 else ''}: use policy 'auto' or a "
                                    f"larger budget", least, budget)
        raise MemoryBudgetError(f"budget {format_bytes(budget)} ({budget} B) is below the minimum feasible "
                                f"{format_bytes(least)} ({least} B) with exact BatchNorm statistics, even with "
                                f"sub-batches of {samples} sample{'s' if samples > 1 else ''}", least, budget)
    return best


@dataclass
class ChunkedPlan:
    """An eval pass on k chunks of ``sub_batch`` samples under ``plan``; the outputs are concatenated."""

    k: int
    sub_batch: int
    plan: object         # Plan of the eval pass on one chunk
    budget: int
    batch_norm_updates = 0

    @property
    def peak_bytes(self) -> int:
        return self.plan.peak_bytes

    @property
    def predicted_seconds(self) -> float:
        return self.k * self.plan.simulation.seconds

    def __getattr__(self, name):          # byte figures and the rest read from the chunk's plan
        if name == "plan":
            raise AttributeError(name)
        return getattr(self.plan, name)

    def run(self, executor, ctx, x, y=None, optimizer=None, t=0, recorder=None, txn=None) -> np.ndarray:
        """Every chunk in turn (a recorded pass is traced whole, every chunk)."""
        b, rec = self.sub_batch, SplitRecording(recorder, t)
        out = np.concatenate([plan.run(executor, ctx, x[j * b:(j + 1) * b], None, None, t,
                                       rec.part(name, len(plan.steps)), txn)
                              for j, (name, plan) in enumerate(runs(self))])
        rec.end(self.peak_bytes, self.budget, self.predicted_seconds)
        return out

    def summary(self, top=10) -> str:
        head = (f"eval in {self.k} chunks of {self.sub_batch}; peak {format_bytes(self.peak_bytes)} "
                f"({self.peak_bytes} B) within budget {format_bytes(self.budget)}")
        return head + "\n" + self.plan.summary(top)


def runs(plan) -> list:
    """The executor runs ``plan``'s step is made of, in order, as (name, the whole Plan it runs): the parts
    of its trace (a whole Plan is one run)."""
    if isinstance(plan, SubBatchPlan):
        return [(f"sub-batch {j + 1} of {plan.k}", plan.sub) for j in range(plan.k)] + [("update", plan.update)]
    if isinstance(plan, StagedPlan):
        return [(f"{plan.k} sub-batches of {plan.sub_batch} stage by stage, then the update", plan.plan)]
    if isinstance(plan, ChunkedPlan):
        return [(f"chunk {j + 1} of {plan.k}", plan.plan) for j in range(plan.k)]
    return [("step", plan)]


def plan_eval(batch, schedule_for, config, cost=None, held_bytes=0):
    """The plan of an eval pass on ``batch`` samples: whole, or the fewest equal chunks that fit.

    ``schedule_for(b)`` returns the eval schedule on b samples; ``config.budget``
    is in bytes. ``held_bytes`` is the persistent region the device holds
    (a trainer's gradients and optimizer state besides the parameters an eval
    pass reads): the budget covers it too, so a plan's arena gets the rest.
    Raises MemoryBudgetError with the minimum at chunks of 1 sample when none fits.
    """
    def plan(b):
        schedule = schedule_for(b)
        other = max(held_bytes - schedule.persistent_bytes, 0)
        try:
            plan = plan_memory(schedule, replace(config, budget=config.budget - other), cost)
        except MemoryBudgetError as e:
            raise MemoryBudgetError(str(e), e.minimum_bytes + other, config.budget) from None
        # its byte figures count the persistent region the device holds, as the budget does
        for name in ("persistent_bytes", "ideal_bytes", "liveness_peak_bytes", "lower_bound_bytes", "minimum_bytes"):
            if getattr(plan, name) is not None:
                setattr(plan, name, getattr(plan, name) + other)
        plan.budget = config.budget
        return plan

    if config.budget is None:
        return plan_memory(schedule_for(batch), config, cost)
    try:
        return plan(batch)
    except MemoryBudgetError as e:
        error = e
    for k in _divisors(batch):
        try:
            return ChunkedPlan(k, batch // k, plan(batch // k), config.budget)
        except MemoryBudgetError as e:
            error = e
    raise MemoryBudgetError(f"budget {format_bytes(config.budget)} ({config.budget} B) is below the minimum "
                            f"feasible {format_bytes(error.minimum_bytes)} ({error.minimum_bytes} B) of an eval "
                            f"pass beside the training state, even in chunks of 1 sample", error.minimum_bytes,
                            config.budget)
