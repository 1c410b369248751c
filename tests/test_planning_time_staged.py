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
from minidnn.memory.planner import plan_memory
from minidnn.memory.subbatch import compute_floor, plan_staged
from minidnn.models.random_dag import SHAPE, RandomDag, random_spec
from minidnn.report import shapes_only, step_splits, training_schedule


def _fingerprint(plan):
    inner = plan.plan
    return (plan.k, sorted(inner.evictions.items()), sorted(inner.algos.items()), inner.keep_within,
            inner.arena_bytes, plan.predicted_seconds)


# (network, input, budget, profile): splits whose largest k planned is left out by its floor
CASES = [("resnet20", (32, 3, 32, 32), 0.15, "v100-16gb"), ("densenet_small", (16, 3, 32, 32), 0.25, "a100-40gb")]


@pytest.mark.parametrize("name,shape,budget,profile", CASES)
def test_a_split_left_unplanned_is_no_faster(name, shape, budget, profile):
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
    args = (batch, lambda k: splits.staged(batch // k, k), lambda b: splits.sub(b)[0], config)
    got, want = plan_staged(*args), plan_staged(*args, floors=False)
    assert got.not_planned and not want.not_planned
    assert _fingerprint(got) == _fingerprint(want)
    for k, floor in got.not_planned:
        assert floor >= got.predicted_seconds
        planned = plan_memory(splits.staged(batch // k, k), config)
        assert planned.simulation.seconds >= floor


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
