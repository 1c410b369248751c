"""The planner's shortcuts give what the direct computation gives: the resumable greedy and the
cached per-program arrays."""
from __future__ import annotations

import numpy as np
import pytest

from minidnn import models, nn, optim
from minidnn.autograd import build_schedule
from minidnn.graph import trace
from minidnn.memory import ProfileCost
from minidnn.memory.planner import AutoPolicy, algorithm_options, fastest
from minidnn.memory.program import lower, touches
from minidnn.memory.simulator import memory_curve
from minidnn.schedule import aligned


@pytest.fixture(scope="module")
def setup():
    g = trace(models.get("resnet20"), (8, 3, 32, 32), loss=nn.CrossEntropyLoss())
    sched = build_schedule(g, optimizer=optim.SGD(lr=0.05, momentum=0.9))
    cost = ProfileCost("titanx-12gb")
    touch = touches(sched)
    options = algorithm_options(sched, cost)
    return sched, cost, touch, options, fastest(options)


@pytest.mark.parametrize("policy", [AutoPolicy(), AutoPolicy(recompute=False), AutoPolicy(offload=False),
                                    AutoPolicy(copies_free=True)])
def test_chooser_answers_each_limit_as_a_fresh_greedy(setup, policy):
    sched, cost, touch, options, algos = setup
    peak = int(memory_curve(lower(sched, {}, touch, algos)).max())
    limits = [int(peak * f) for f in (0.9, 0.5, 0.7, 0.2, 0.05, 0.6, 0.95, 0.01)]
    choose = policy.chooser(sched, cost, touch, options, algos)
    for limit in limits:                      # higher and lower limits, in no order
        assert choose(limit) == policy.choose(sched, limit, cost, touch, options, algos)


def test_program_buffers_match_residencies(setup):
    sched, cost, touch, options, algos = setup
    ev = AutoPolicy().evictions(sched, 0.5 * sched.arena_bytes_no_reuse / 4, cost, touch)
    program = lower(sched, ev or {}, touch, algos)
    starts, ends, sizes = program.buffers
    res = program.residencies
    assert starts.tolist() == [r.start for r in res] and ends.tolist() == [r.end for r in res]
    assert sizes.tolist() == [aligned(program.tensors[r.tensor].nbytes) for r in res]
    curve = np.zeros(len(program.steps), np.int64)
    for r, n in zip(res, sizes):
        curve[r.start:r.end + 1] += n
    assert memory_curve(program).tolist() == curve.tolist()


def test_kept_chain_inputs_recompute_less_and_change_no_bit():
    """Every value dropped and recomputed (chains of dropped inputs): keeping a chain's inputs for a
    next use within the horizon runs fewer recompute steps, and training gives the same bits."""
    import minidnn
    from minidnn.memory.planner import _Candidates, make_plan

    shape = (4, 3, 16, 16)

    def trainer():
        net = models.get("resnet20").init_parameters(0)
        return minidnn.compile(net, shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.05, momentum=0.9),
                               dtype=np.float64, memory=minidnn.MemoryConfig(algorithms="default", check=True,
                                                                            poison=True))
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal(shape), rng.integers(0, 10, shape[0])) for _ in range(2)]
    ref = trainer()
    for x, y in batches:
        ref.step(x, y)
    sched = ref.plan.schedule
    cost, touch = ProfileCost("titanx-12gb"), touches(sched)
    ev = _Candidates(sched, cost, touch, allow_recompute=True, allow_offload=False).all()
    assert ev and all(e.kind == "recompute" for e in ev.values())
    recomputes = {}
    for keep in (0, 64):
        t = trainer()
        plan = make_plan(t.plan.schedule, ev, cost, "all recomputed", touch=touches(t.plan.schedule), algos={},
                         keep_within=keep)
        t._plans[("train", shape)] = plan
        for x, y in batches:
            t.step(x, y)
        recomputes[keep] = sum(s.kind == "recompute" for s in plan.program.steps)
        assert t.measured_peak_bytes == plan.peak_bytes
        for k, v in ref.net.state_dict().items():
            assert np.array_equal(np.asarray(v), np.asarray(t.net.state_dict()[k])), (keep, k)
    assert recomputes[64] < recomputes[0], recomputes
