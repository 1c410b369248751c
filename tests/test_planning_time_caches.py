"""What the planner keeps to plan faster gives what computing afresh gives: the greedy's trial walks
kept while what they asked about is unchanged (greedy.TrialWalks), the search's plans kept by
their decisions (planner.Builds), and the step times kept by their step (costmodel.CachedCost)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from minidnn import MemoryBudgetError, models, nn, optim
from minidnn.autograd import build_schedule
from minidnn.graph import trace
from minidnn.memory import MemoryConfig, ProfileCost
from minidnn.memory.costmodel import CachedCost
from minidnn.memory.greedy import AutoPolicy, Greedy
from minidnn.memory.knobs import Knobs
from minidnn.memory.planner import algorithm_options, fastest, plan_memory
from minidnn.memory.facts import Facts
from minidnn.memory.program import lower
from minidnn.memory.simulator import memory_curve
from minidnn.models.random_dag import SHAPE, RandomDag, random_spec


class _Afresh:
    """TrialWalks that keeps nothing: every trial walk is walked again."""

    def walk(self, greedy, c, k, kind, lead=None):
        return greedy.walk(c)

    def changed_tensor(self, t):
        pass

    def changed_step(self, s):
        pass


def _schedule(net, shape):
    return build_schedule(trace(net, shape, loss=nn.CrossEntropyLoss()), optimizer=optim.SGD(lr=0.1, momentum=0.9))


def _dag(seed, nodes=24):
    return _schedule(RandomDag(random_spec(np.random.default_rng(seed), nodes)), SHAPE)


SCHEDULES = {
    "resnet20": lambda: _schedule(models.get("resnet20"), (8, 3, 32, 32)),
    "densenet_small": lambda: _schedule(models.get("densenet_small"), (4, 3, 32, 32)),
    "dag-3": lambda: _dag(3),
    "dag-11": lambda: _dag(11),
}


def _decisions(sched, profile, fraction, policy):
    cost = ProfileCost(profile)
    facts = Facts(sched)
    options = algorithm_options(sched, cost)
    algos = fastest(options)
    peak = int(memory_curve(lower(sched, {}, facts, algos)).max())
    runs = []
    for trials in (None, _Afresh()):
        g = Greedy(facts, cost, policy.recompute, policy.offload, options, algos, policy.copies_free,
                   policy.knobs, policy.copy_windows)
        if trials is not None:
            g.trials = trials
        runs.append([g.greedy(int(f * peak)) for f in (fraction, fraction / 2)] + [g.decisions, g.peaks])
    return runs


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("profile,fraction", [("titanx-12gb", 0.5), ("a100-40gb", 0.25)])
@pytest.mark.parametrize("policy", [AutoPolicy(), AutoPolicy(copy_windows=True), AutoPolicy(offload=False),
                                    AutoPolicy(knobs=Knobs(timed_offloads=True))])
def test_kept_trial_walks_decide_as_walking_afresh(name, profile, fraction, policy):
    kept, afresh = _decisions(SCHEDULES[name](), profile, fraction, policy)
    assert kept == afresh


def _fingerprint(sched, config, knobs=Knobs()):
    """The plan's decisions, bytes, seconds and search log (or the minimum a refusal names)."""
    try:
        plan = plan_memory(sched, config, knobs=knobs)
    except MemoryBudgetError as e:
        return e.minimum_bytes
    return (sorted(plan.evictions.items()), sorted(plan.algos.items()), plan.keep_within, plan.arena_bytes,
            plan.simulation.seconds, [(t.what, t.bytes, t.seconds, t.kept) for t in plan.log])


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("budget", ["60%", "40%"])
def test_kept_builds_plan_as_building_afresh(name, budget):
    sched = SCHEDULES[name]()
    config = MemoryConfig(budget=budget, profile="v100-16gb")
    kept = _fingerprint(sched, config)
    assert kept == _fingerprint(sched, config, dataclasses.replace(Knobs(), kept_builds=0))
    assert kept == _fingerprint(sched, config, dataclasses.replace(Knobs(), kept_builds=2))


def test_kept_step_times_are_each_schedules_own():
    """One CachedCost asked about two schedules, in turn, gives each step the time its own
    schedule's step takes (steps are known by their index: the times of one schedule's step 5 are
    not another's), and a plan made with a cache that served another schedule first is the plan
    made with a new one."""
    first = _schedule(RandomDag(random_spec(np.random.default_rng(0), 16)), SHAPE)
    second = _schedule(RandomDag(random_spec(np.random.default_rng(1), 24)), SHAPE)
    profile = ProfileCost("v100-16gb")
    shared = CachedCost(profile)
    for sched in (first, second, first):
        assert [shared.step_seconds(sched, s) for s in sched.steps] == [profile.step_seconds(sched, s)
                                                                          for s in sched.steps]
    assert any(profile.step_seconds(first, a) != profile.step_seconds(second, b)
               for a, b in zip(first.steps, second.steps))
    config = MemoryConfig(budget="80%", profile="v100-16gb")
    plan_memory(first, config, shared)
    again = plan_memory(second, config, shared)
    afresh = plan_memory(second, config, CachedCost(profile))
    assert again.evictions == afresh.evictions and again.simulation.seconds == afresh.simulation.seconds
