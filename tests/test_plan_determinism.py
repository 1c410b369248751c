"""The same network, budget and profile give the same plan on every machine: no choice among equals
falls by the order a primitive or a dict happens to return them in.

Two perturbations are checked. The greedy's candidate ranking is compared with the order its
docstring promises, (ratio, index), on arrays full of ties (NumPy's ``argpartition`` returns equal
values in an order that depends on its SIMD dispatch, so on the CPU). And whole networks are planned
twice, the second time with every tensor offered to the planner in the reverse order (the tensors'
touch map iterated backwards): decisions, algorithms, bytes and predicted seconds must be identical.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minidnn import models
from minidnn.memory import MemoryConfig, plan_memory
from minidnn.memory import planner as planner_module
from minidnn.memory.greedy import _cheapest_first
from minidnn.memory.facts import Facts, Touches, touches
from minidnn.report import shapes_only, training_schedule


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.0 + 2**-52, 3.0, np.inf]), min_size=0, max_size=80),
       st.integers(1, 20))
def test_cheapest_first_orders_by_value_then_index(values, head):
    ratio = np.array(values, np.float64)
    assert list(_cheapest_first(ratio, head)) == sorted(range(len(values)), key=lambda i: (values[i], i))


def _reversed_facts(schedule) -> Facts:
    """The schedule's facts, its touches with the tensors in the reverse order (each one's steps unchanged)."""
    touch = touches(schedule)
    out = Touches(reversed(list(touch.items())))
    out.by_step = touch.by_step
    return Facts(schedule, out)


def _decisions(plan):
    return (sorted((k, v.kind, v.delay, v.lead) for k, v in plan.evictions.items()),
            sorted((i, a.name, a.workspace) for i, a in plan.algos.items()),
            plan.arena_bytes, plan.peak_bytes, plan.simulation.seconds)


CASES = [("resnet50", (32, 3, 224, 224), 0.22, "a100-40gb"),
         ("resnet50", (32, 3, 224, 224), 0.5, "v100-16gb"),
         ("densenet121", (8, 3, 224, 224), 0.3, "h100-80gb"),
         ("vgg16", (32, 3, 224, 224), 0.6, "titanx-12gb"),
         ("resnet_deep", (16, 3, 32, 32), 0.9, "titanx-12gb")]


@pytest.mark.parametrize("name,shape,budget,profile", CASES, ids=[f"{c[0]}-{c[2]:.0%}-{c[3]}" for c in CASES])
def test_plans_do_not_depend_on_the_order_tensors_are_offered_in(monkeypatch, name, shape, budget, profile):
    with shapes_only():
        sched = training_schedule(models.get(name), shape)[1]
    config = MemoryConfig(budget=budget, profile=profile)
    plain = plan_memory(sched, config)
    monkeypatch.setattr(planner_module, "Facts", _reversed_facts)
    perturbed = plan_memory(sched, config)
    assert plain.evictions, "the budget must make the planner choose"
    assert _decisions(perturbed) == _decisions(plain)
