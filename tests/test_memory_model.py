"""One memory model: the curve the greedy plans against is the lowered program's, byte for byte.

After any number of the greedy's decisions, its curve (the most arena bytes held during each
schedule step) equals ``memory_curve(lower(...))`` grouped by schedule step, before placement and
before the copies are timed; and its lowered program never needs more than the target it was
asked for (so a lower target never gives a program above it).
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minidnn import models, nn, optim
from minidnn.autograd import build_schedule
from minidnn.graph import trace
from minidnn.memory import ProfileCost
from minidnn.memory.greedy import Greedy
from minidnn.memory.knobs import Knobs
from minidnn.memory.planner import algorithm_options, fastest
from minidnn.memory.facts import Facts, touches
from minidnn.memory.program import Evict, lower, recompute_seconds
from minidnn.memory.simulator import memory_curve, simulate
from minidnn.memory.transfers import schedule_groups

from test_dag_property import SHAPE, RandomDag, dags

FRACTIONS = [1 - k / 40 for k in range(1, 41)]


def grouped(program, n):
    """The most arena bytes held during each schedule step's program steps."""
    curve = np.zeros(n, np.int64)
    np.maximum.at(curve, schedule_groups(program, n), memory_curve(program))
    return curve


def check_exact(sched, profile, recompute=True, offload=True, copy_windows=False, knobs=Knobs()):
    """Walk the greedy down through targets; at each, its curve is the lowered one. The number of
    targets at which it evicted something."""
    cost = ProfileCost(profile)
    touch = touches(sched)
    options = algorithm_options(sched, cost)
    algos = fastest(options)
    n = len(sched.steps)
    greedy = Greedy(Facts(sched, touch), cost, recompute, offload, options, algos, copy_windows=copy_windows,
                    knobs=knobs)
    assert np.array_equal(greedy.predicted_curve(), grouped(lower(sched, {}, touch, algos), n))
    top = int(greedy.predicted_curve().max())
    evicted = 0
    for f in FRACTIONS:
        target = int(f * top)
        ev, chosen = greedy.greedy(target)
        if ev is None:
            break
        program = lower(sched, ev, touch, chosen)
        lowered = grouped(program, n)
        assert np.array_equal(greedy.predicted_curve(), lowered), f
        assert int(memory_curve(program).max(initial=0)) <= target
        evicted += bool(ev)
    assert all(a >= b for a, b in zip(greedy.peaks, greedy.peaks[1:]))   # the peaks never rise
    return evicted


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=dags(max_nodes=10), profile=st.sampled_from(["cpu-2core", "titanx-12gb", "a100-40gb"]),
       kinds=st.sampled_from([(True, True), (True, False), (False, True)]))
def test_random_dag_curve_is_the_lowered_curve(spec, profile, kinds):
    sched = build_schedule(trace(RandomDag(spec), SHAPE, loss=nn.CrossEntropyLoss()))
    check_exact(sched, profile, *kinds)


# (VGG-11's classifier update needs a 64 MiB workspace, more than its activations at 32x32:
# planned without an optimizer, its activations set the peak)
ZOO = {"resnet20": ((8, 3, 32, 32), {}, True), "densenet_small": ((8, 3, 32, 32), {}, True),
       "vgg11": ((16, 3, 32, 32), {"num_classes": 10, "image_size": 32}, False)}


@pytest.mark.parametrize("name", list(ZOO))
@pytest.mark.parametrize("profile", ["titanx-12gb", "a100-40gb"])
def test_model_zoo_curve_is_the_lowered_curve(name, profile):
    shape, kw, update = ZOO[name]
    g = trace(models.get(name, **kw), shape, loss=nn.CrossEntropyLoss())
    sched = build_schedule(g, optimizer=optim.SGD(lr=0.05, momentum=0.9) if update else None)
    assert check_exact(sched, profile) >= 3       # it did plan: several targets needed evictions


TIMED = Knobs(timed_offloads=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=dags(max_nodes=10), profile=st.sampled_from(["cpu-2core", "titanx-12gb", "a100-40gb"]))
def test_offloads_timed_at_the_peak_plan_on_the_lowered_curve(spec, profile):
    """With its offloads timed for the peak they lower (their buffers held while the copy out runs,
    prefetched early, an offload timed again to free a later peak), the greedy's curve is still the
    lowering's, holds and leads included."""
    sched = build_schedule(trace(RandomDag(spec), SHAPE, loss=nn.CrossEntropyLoss()))
    check_exact(sched, profile, knobs=TIMED)


@pytest.mark.parametrize("name", ["resnet20", "densenet_small"])
def test_offloads_timed_at_the_peak_hold_their_buffers(name):
    """On the zoo too; and the timed offloads hold or lead somewhere (the copies of ResNet-20's and
    the small DenseNet's activations take longer than the step after them)."""
    shape, kw, update = ZOO[name]
    g = trace(models.get(name, **kw), shape, loss=nn.CrossEntropyLoss())
    sched = build_schedule(g, optimizer=optim.SGD(lr=0.05, momentum=0.9))
    assert check_exact(sched, "titanx-12gb", knobs=TIMED) >= 3
    cost, touch = ProfileCost("titanx-12gb"), touches(sched)
    options = algorithm_options(sched, cost)
    greedy = Greedy(Facts(sched, touch), cost, True, True, options, fastest(options), knobs=TIMED)
    ev, _ = greedy.greedy(int(0.5 * greedy.predicted_curve().max()))
    offloads = [e for e in ev.values() if e.kind == "offload"]
    assert offloads and any(e.delay or e.lead for e in offloads)


def test_the_copy_stream_by_direction_plans_on_the_same_curve():
    """The greedy that gives the copy stream its room by direction decides differently (it offloads
    where the forward's and the backward's copy queues have room), on the same memory model."""
    g = trace(models.get("resnet20"), (8, 3, 32, 32), loss=nn.CrossEntropyLoss())
    sched = build_schedule(g, optimizer=optim.SGD(lr=0.05, momentum=0.9))
    assert check_exact(sched, "titanx-12gb", copy_windows=True) >= 3


def check_recompute_estimates(sched, profile):
    """Every finite ``recompute_seconds`` of a gap that closes in the backward equals the seconds
    of the recomputations its lowering runs, that gap alone evicted; the number of those
    lowerings that fuse a chain."""
    cost = ProfileCost(profile)
    touch = touches(sched)
    producer = {t: s for s in sched.steps if s.kind == "forward" for t in s.outs}
    secs = [cost.step_seconds(sched, s) for s in sched.steps]
    last_forward = max(s.index for s in sched.steps if s.kind == "forward")
    fused = 0
    for t, ts in touch.items():
        for g in range(len(ts) - 1):
            if t not in producer or ts[g + 1] <= last_forward:
                continue
            estimate = recompute_seconds(t, ts[g + 1], touch, producer, secs, sched.tensors)
            if estimate == float("inf"):
                continue
            program = lower(sched, {(t, g): Evict("recompute")}, touch)
            assert estimate == pytest.approx(simulate(program, sched, cost).recompute_seconds, rel=1e-9), \
                sched.tensors[t].name
            fused += any(s.kind == "recompute" and "+" in s.label for s in program.steps)
    return fused


@pytest.mark.parametrize("name", ["resnet20", "densenet_small"])
def test_a_recomputations_estimate_is_the_chain_its_lowering_runs(name):
    """The estimate the greedy ranks by, the trades and the floor charge: with the lowering's
    fusion (ResNet-20's BatchNorm, add and ReLU are one pass, not three)."""
    g = trace(models.get(name), (4, 3, 32, 32), loss=nn.CrossEntropyLoss())
    assert check_recompute_estimates(build_schedule(g), "v100-16gb") >= 6     # fused chains were checked


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=dags(max_nodes=10), profile=st.sampled_from(["cpu-2core", "a100-40gb"]))
def test_random_dag_recompute_estimates_are_the_lowered_chains(spec, profile):
    check_recompute_estimates(build_schedule(trace(RandomDag(spec), SHAPE, loss=nn.CrossEntropyLoss())), profile)


def test_a_stuck_greedy_offloads_what_a_chain_recomputes_and_goes_on_lower():
    """Where no gap left lowers the peak, a value that the peak step's restore chain recomputes
    (because an earlier decision recomputes it) is offloaded instead: the decision is recorded after
    the recomputation it replaces, the curve is still the lowered one, and the greedy then lowers
    the peak further than where it was stuck (ResNet-20 b8 on titanx-12gb: three such moves)."""
    g = trace(models.get("resnet20"), (8, 3, 32, 32), loss=nn.CrossEntropyLoss())
    sched = build_schedule(g, optimizer=optim.SGD(lr=0.05, momentum=0.9))
    cost, touch = ProfileCost("titanx-12gb"), touches(sched)
    options = algorithm_options(sched, cost)
    algos = fastest(options)
    greedy = Greedy(Facts(sched, touch), cost, True, True, options, algos)
    greedy.greedy(0)
    decided = [d[1] for d in greedy.decisions]
    converted = [i for i, d in enumerate(greedy.decisions)
                 if d[0] == "evict" and d[2].kind == "offload" and d[1] in decided[:i]]
    assert converted
    for i in converted:
        earlier = decided.index(greedy.decisions[i][1])
        assert greedy.decisions[earlier][2].kind == "recompute"
        ev, chosen = greedy.greedy(greedy.peaks[i] - 1)       # the decisions up to the conversion
        assert ev[greedy.decisions[i][1]].kind == "offload"
        lowered = grouped(lower(sched, ev, touch, chosen), len(sched.steps))
        assert lowered.max() < greedy.peaks[i]
    assert min(greedy.peaks) < greedy.peaks[converted[-1]]
