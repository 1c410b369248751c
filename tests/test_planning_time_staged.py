"""A staged split that plan_staged does not plan (its floor is no faster than the best split found)
is one that planning would have found no faster: the plan is the same with or without the floors,
and every split left out, planned, is predicted no faster than its floor, nor than the plan."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from minidnn import MemoryBudgetError, models, nn, optim
from minidnn.autograd import build_schedule
from minidnn.graph import trace
from minidnn.memory import MemoryConfig
from minidnn.memory.knobs import Knobs
from minidnn.memory.planner import plan_memory
from minidnn.memory.subbatch import compute_floor, plan_staged, plan_step
from minidnn.models.random_dag import SHAPE, RandomDag, random_spec
from minidnn.report import shapes_only, step_splits, training_schedule


def _fingerprint(plan):
    inner = plan.plan
    return (plan.k, sorted(inner.evictions.items()), sorted(inner.algos.items()), inner.keep_within,
            inner.arena_bytes, plan.predicted_seconds)


# (network, input, budget, profile): splits whose largest k planned is left out by its floor
CASES = [("resnet20", (32, 3, 32, 32), 0.15, "v100-16gb"), ("densenet_small", (16, 3, 32, 32), 0.25, "a100-40gb")]


def _split_case(name, shape, budget, profile):
    """(the network's Splits, the config with the budget in bytes, plan_staged's arguments)."""
    with shapes_only():
        net = models.get(name)
    _, schedule = training_schedule(net, shape)
    splits = step_splits(net, shape)
    config = MemoryConfig(budget=budget, profile=profile)
    try:
        limit = plan_memory(schedule, config).budget
    except MemoryBudgetError as e:
        limit = e.budget_bytes
    config = replace(config, budget=limit)
    batch = shape[0]
    return splits, config, (batch, lambda k: splits.staged(batch // k, k), lambda b: splits.sub(b)[0], config)


@pytest.mark.parametrize("name,shape,budget,profile", CASES)
def test_a_split_left_unplanned_is_no_faster(name, shape, budget, profile):
    splits, config, args = _split_case(name, shape, budget, profile)
    batch = shape[0]
    every_k_in_full = Knobs(split_choice_seed_steps=None)    # (the floors, not the lighter search, end these)
    got, want = plan_staged(*args, knobs=every_k_in_full), plan_staged(*args, floors=False, knobs=every_k_in_full)
    assert got.not_planned and not want.not_planned
    assert _fingerprint(got) == _fingerprint(want)
    for k, floor in got.not_planned:
        assert floor >= got.predicted_seconds
        planned = plan_memory(splits.staged(batch // k, k), config)
        assert planned.simulation.seconds >= floor


@pytest.mark.parametrize("name,shape,budget,profile", CASES)
def test_the_k_a_lighter_search_chooses_is_planned_in_full(name, shape, budget, profile):
    """The splits are compared by plans of the lighter search (Knobs.split_choice_seed_steps): the k
    chosen is the fastest of those the lighter search planned, and gets the faster of its lighter
    plan and the full search's, so it is never slower than the full search at that k."""
    splits, config, args = _split_case(name, shape, budget, profile)
    batch = shape[0]
    got = plan_staged(*args)
    staged = splits.staged(batch // got.k, got.k)
    full = plan_memory(staged, config)
    lighter = Knobs(baseline_seed_steps=Knobs().split_choice_seed_steps, hidden_chain_seed=True)
    light = plan_memory(staged, config, knobs=lighter)
    assert got.predicted_seconds == min(full.predicted_seconds, light.predicted_seconds)
    for k in (2, 4):
        if k != got.k:
            other = plan_memory(splits.staged(batch // k, k), config, knobs=lighter)
            assert other.predicted_seconds >= light.predicted_seconds


@pytest.mark.parametrize("name,shape,budget,profile", CASES)
def test_a_split_measured_against_a_bar_beats_it_or_is_none(name, shape, budget, profile):
    """plan_staged(..., bar=s) (s: the seconds of the whole step's plan) returns a split predicted
    faster than s, or None: the split it returns without a bar where that one is faster, None where
    the bar is that split's own time, or below the compute floor of every k (planned or not)."""
    splits, config, args = _split_case(name, shape, budget, profile)
    batch = shape[0]
    free = plan_staged(*args)
    assert _fingerprint(plan_staged(*args, bar=float("inf"))) == _fingerprint(free)
    assert plan_staged(*args, bar=free.predicted_seconds) is None
    below = compute_floor(splits.staged(batch // 2, 2), config) * (1 - 1e-9)
    assert plan_staged(*args, bar=below) is None


def test_the_default_plan_is_the_faster_of_the_whole_step_and_its_split():
    """The default (sub_batching="fastest", BatchNorm exact) plans the step whole and, where it fits,
    measures the staged split against it: the plan is never predicted slower than the whole step's,
    and it is the split exactly where plan_staged finds one faster. Over these budgets ResNet-20
    (batch 64, on the Titan X) gets both a whole step and a split of a step that fits whole (at 15%:
    48.2 ms whole, 34.1 ms as 2 x 32)."""
    shape, profile = (64, 3, 32, 32), "titanx-12gb"
    with shapes_only():
        net = models.get("resnet20")
    _, schedule = training_schedule(net, shape)
    splits = step_splits(net, shape)
    kinds = set()
    for budget in (0.3, 0.2, 0.15, 0.12):
        config = MemoryConfig(budget=budget, profile=profile)
        got = plan_step(schedule, config, splits=splits)
        try:
            whole = plan_memory(schedule, config)
        except MemoryBudgetError:       # only a split fits: the split sub_batching=True makes too
            assert got.whole_seconds is None and "whole step, which fits" not in got.summary()
            assert _fingerprint(got) == _fingerprint(plan_step(schedule, replace(config, sub_batching=True),
                                                               splits=splits))
            continue
        assert got.predicted_seconds <= whole.predicted_seconds
        split = plan_staged(shape[0], lambda k: splits.staged(shape[0] // k, k), lambda b: splits.sub(b)[0],
                            replace(config, budget=whole.budget), bar=whole.predicted_seconds)
        assert (got.k > 1) == (split is not None)
        if split is not None:
            assert got.predicted_seconds == split.predicted_seconds < whole.predicted_seconds
            assert got.whole_seconds == whole.predicted_seconds          # the summary says what it beat
            assert f"whole step, which fits at {whole.predicted_seconds * 1e3:.2f} ms" in got.summary()
            # Knobs.split_trial_steps bounds k by the step's size: below 2 sub-batches' worth, whole
            steps = len(schedule.steps)
            assert plan_step(schedule, config, splits=splits, knobs=Knobs(split_trial_steps=2 * steps - 1)).k == 1
            assert plan_step(schedule, config, splits=splits,
                             knobs=Knobs(split_trial_steps=got.k * steps)).predicted_seconds == got.predicted_seconds
        kinds.add(got.k > 1)
    assert kinds == {False, True}


def _schedule(net, shape):
    return build_schedule(trace(net, shape, loss=nn.CrossEntropyLoss()), optimizer=optim.SGD(lr=0.1, momentum=0.9))


SCHEDULES = {
    "resnet20": lambda: _schedule(models.get("resnet20"), (8, 3, 32, 32)),
    "densenet_small": lambda: _schedule(models.get("densenet_small"), (4, 3, 32, 32)),
    "dag-3": lambda: _schedule(RandomDag(random_spec(np.random.default_rng(3), 24)), SHAPE),
    "dag-11": lambda: _schedule(RandomDag(random_spec(np.random.default_rng(11), 24)), SHAPE),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("profile", ["v100-16gb", "titanx-12gb"])
def test_no_plan_is_faster_than_the_floor(name, profile):
    """Every plan the search tries (each trial of its log) and the one it returns are predicted no
    faster than compute_floor: a floor over every step at its fastest algorithm."""
    schedule = SCHEDULES[name]()
    for budget in (None, 0.6, 0.4):
        config = MemoryConfig(budget=budget, profile=profile)
        floor = compute_floor(schedule, config)
        try:
            plan = plan_memory(schedule, config)
        except MemoryBudgetError:
            continue
        assert plan.simulation.seconds >= floor
        assert all(t.seconds >= floor for t in plan.log if t.seconds is not None)
