"""A lowering resumed from another's checkpoint (program.lower's ``base``) is the lowering from the
first step: the same steps, residencies, workspaces and host store, whatever the decisions change."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from minidnn import models, nn, optim
from minidnn.autograd import build_schedule
from minidnn.graph import trace
from minidnn.memory import ProfileCost
from minidnn.memory.greedy import AutoPolicy
from minidnn.memory.planner import algorithm_options, fastest, smallest
from minidnn.memory.facts import Facts, touches
from minidnn.memory.program import Evict, lower, shared_steps
from minidnn.memory.simulator import memory_curve
from minidnn.models.random_dag import SHAPE, RandomDag, random_spec


def _schedule(net, shape):
    return build_schedule(trace(net, shape, loss=nn.CrossEntropyLoss()), optimizer=optim.SGD(lr=0.1, momentum=0.9))


SCHEDULES = {
    "resnet20": lambda: _schedule(models.get("resnet20"), (8, 3, 32, 32)),
    "densenet_small": lambda: _schedule(models.get("densenet_small"), (4, 3, 32, 32)),
    "dag-3": lambda: _schedule(RandomDag(random_spec(np.random.default_rng(3), 24)), SHAPE),
    "dag-11": lambda: _schedule(RandomDag(random_spec(np.random.default_rng(11), 24)), SHAPE),
}


def _program(p):
    steps = [(s.index, s.kind, s.label, list(s.reads), list(s.writes), list(s.ins), list(s.outs), s.ws, s.algo)
             for s in p.steps]
    res = [(r.tensor, r.start, r.end, r.origin, r.wait_offload, r.delay) for r in p.residencies]
    tensors = [(t.id, t.name, t.nbytes) for t in p.tensors]
    return steps, res, tensors, p.origin, p.host_slots, p.host_bytes, p.tensor_bytes.tolist()


def _variants(rng, ev, touch, n):
    """Decisions near ``ev``: some dropped, turned into the other kind or timed otherwise; then
    offloads held and prefetched otherwise only (as the copy timing's trials)."""
    keys = sorted(ev)
    out = []
    for _ in range(12):
        new = dict(ev)
        for key in rng.permutation(len(keys))[:max(1, len(keys) // 4)].tolist():
            key = keys[key]
            e, (a, b) = new[key], (touch[key[0]][key[1]], touch[key[0]][key[1] + 1])
            move = rng.integers(5)
            if move == 0:
                del new[key]
            elif e.kind == "offload" and move in (1, 2):
                new[key] = dataclasses.replace(e, delay=int(rng.integers(0, b - a)), lead=int(rng.integers(0, b - a)))
            elif e.kind == "offload" and move == 3:
                new[key] = Evict("recompute")
            else:
                new[key] = Evict("offload", delay=int(rng.integers(0, 3)), lead=int(rng.integers(0, 3)))
        out.append(new)
    offloads = [key for key in keys if ev[key].kind == "offload"]
    for _ in range(6 if offloads else 0):   # the copy timing's trials: holds and prefetches moved only
        new = dict(ev)
        for key in rng.permutation(len(offloads))[:max(1, len(offloads) // 3)].tolist():
            key = offloads[key]
            a, b = touch[key[0]][key[1]], touch[key[0]][key[1] + 1]
            new[key] = dataclasses.replace(new[key], delay=int(rng.integers(0, b - a)),
                                           lead=int(rng.integers(0, max(1, (b - a) // 3))))
        out.append(new)
    return out


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("checkpoints", [1, 5, 64])
@pytest.mark.parametrize("keep_within", [0, 4])
def test_resumed_lowering_is_the_lowering(name, checkpoints, keep_within):
    sched = SCHEDULES[name]()
    cost, touch, n = ProfileCost("v100-16gb"), touches(sched), len(sched.steps)
    options = algorithm_options(sched, cost)
    rng = np.random.default_rng(checkpoints)
    for algos in (fastest(options), smallest(options)):
        peak = int(memory_curve(lower(sched, {}, touch, algos)).max())
        for policy, share in ((AutoPolicy(), 0.5), (AutoPolicy(copy_windows=True), 0.3),
                              (AutoPolicy(recompute=False), 0.6)):
            ev, _ = policy.choose(Facts(sched, touch), int(share * peak), cost, options, algos)
            if not ev:
                continue
            base = lower(sched, ev, touch, algos, keep_within, checkpoints=checkpoints)
            assert _program(base) == _program(lower(sched, ev, touch, algos, keep_within))
            for new in _variants(rng, ev, touch, n):
                try:
                    want = _program(lower(sched, new, touch, algos, keep_within))
                except ValueError:             # a value the variant drops that nothing restores
                    with pytest.raises(ValueError):
                        lower(sched, new, touch, algos, keep_within, base=base, checkpoints=checkpoints)
                    continue
                got = lower(sched, new, touch, algos, keep_within, base=base, checkpoints=checkpoints)
                assert _program(got) == want
                # and a lowering resumed from a resumed one
                again = dict(new)
                again.pop(max(again), None)
                assert (_program(lower(sched, again, touch, algos, keep_within, base=got, checkpoints=checkpoints))
                        == _program(lower(sched, again, touch, algos, keep_within)))
                assert shared_steps(touch, ev, new, n) <= n


def test_resumed_lowering_needs_the_same_algorithms_and_horizon():
    sched = SCHEDULES["resnet20"]()
    cost, touch = ProfileCost("v100-16gb"), touches(sched)
    options = algorithm_options(sched, cost)
    algos = fastest(options)
    peak = int(memory_curve(lower(sched, {}, touch, algos)).max())
    ev, _ = AutoPolicy().choose(Facts(sched, touch), peak // 2, cost, options, algos)
    base = lower(sched, ev, touch, algos, 0, checkpoints=8)
    for other_algos, horizon in ((smallest(options), 0), (algos, 3)):
        got = lower(sched, ev, touch, other_algos, horizon, base=base, checkpoints=8)
        assert _program(got) == _program(lower(sched, ev, touch, other_algos, horizon))
