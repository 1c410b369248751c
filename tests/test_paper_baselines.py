"""The papers' policies on the case their papers report: VGG-16 at batch 256 (224x224) in 12 GiB on
the GTX Titan X profile, where vDNN trains (Rhu et al., MICRO 2016) - and the two mechanisms that
make vDNN's rule what its paper describes: an offload that runs beside the layer that last reads its
tensor (the tensor freed after that layer), and prefetches issued one layer ahead where the arena
holds them, later where it does not. Planning only (shapes; no kernel runs)."""
from __future__ import annotations

import pytest

from minidnn import models, nn, optim
from minidnn.autograd import build_schedule
from minidnn.graph import trace
from minidnn.memory import MemoryConfig, ProfileCost, plan_memory
from minidnn.memory.baselines import (Layers, Prefetching, Recorded, layerwise_offloads, live_bytes,
                                      memory_optimal)
from minidnn.memory.planner import algorithm_options, fastest
from minidnn.memory.policies import get_policy
from minidnn.memory.facts import Facts, touches
from minidnn.memory.program import Evict, lower
from minidnn.memory.simulator import simulate
from minidnn.memory.transfers import step_curve
from minidnn.report import shapes_only
from minidnn.schedule import ACT_GRAD

BUDGET, PROFILE = 12 * 2**30, "titanx-12gb"
VDNN = ("vdnn_all", "vdnn_conv", "vdnn_dyn")


@pytest.fixture(scope="module")
def vgg():
    with shapes_only():
        g = trace(models.get("vgg16"), (256, 3, 224, 224), loss=nn.CrossEntropyLoss())
    return build_schedule(g, optimizer=optim.SGD(lr=0.01, momentum=0.9))


@pytest.fixture(scope="module")
def plans(vgg):
    out = {}
    for name in VDNN + ("modnn",):
        rec = Recorded(get_policy(name))
        out[name] = rec, plan_memory(vgg, MemoryConfig(budget=BUDGET, policy=rec, profile=PROFILE))
    return out


@pytest.mark.parametrize("name", VDNN + ("modnn",))
def test_the_papers_policies_plan_vgg16_b256_within_12gib(vgg, plans, name):
    rec, plan = plans[name]
    assert rec.owns(plan), "plan_memory fell back to its own minimum plan"
    assert plan.peak_bytes <= BUDGET and plan.budget == BUDGET
    assert plan.evictions and all(ev.kind == "offload" for ev in plan.evictions.values())   # swap-only papers
    assert all(vgg.tensors[t].category != ACT_GRAD for t, _ in plan.evictions)              # no gradient moves


def test_vdnn_dyn_is_at_or_below_the_static_configurations(plans):
    """vDNN_dyn keeps the fastest algorithm wherever the budget allows it; vDNN_all and vDNN_conv
    fall back to the memory-optimal algorithm everywhere when the fastest do not fit."""
    dyn = plans["vdnn_dyn"][1].simulation.seconds
    assert dyn <= plans["vdnn_all"][1].simulation.seconds and dyn <= plans["vdnn_conv"][1].simulation.seconds


def test_vdnn_offloads_beside_the_last_reader_and_frees_after_it(vgg):
    """Each offload of vDNN's set is issued just before its tensor's last forward reader runs, and the
    buffer is freed after that reader, once the copy is done; the copy starts with the reader."""
    touch = touches(vgg)
    ev = layerwise_offloads(Facts(vgg, touch))
    assert ev and all(e.early and e.delay == 0 for e in ev.values())
    program = lower(vgg, ev, touch)
    sim = simulate(program, vgg, ProfileCost(PROFILE))
    runs = {o: i for i, o in enumerate(program.origin) if o >= 0}        # schedule step -> its program step
    by_tensor = {r.tensor: r for r in program.residencies if r.wait_offload is not None}
    for (t, g), e in ev.items():
        reader = runs[touch[t][g]]
        r = by_tensor[t]
        assert program.steps[r.wait_offload].kind == "offload" and r.wait_offload < reader
        assert all(program.steps[i].kind in ("offload", "prefetch", "recompute")
                   for i in range(r.wait_offload + 1, reader))           # nothing of the schedule between
        assert r.end == reader                                           # freed after the reader
        assert sim.start[r.wait_offload] <= sim.start[reader]            # the copy runs beside the reader


def test_an_early_offload_of_a_touch_that_writes_is_refused(vgg):
    touch = touches(vgg)
    t = next(t for t, ts in touch.ordered() if len(ts) > 2 and t in vgg.steps[ts[0]].writes)
    with pytest.raises(ValueError, match="writes it"):
        lower(vgg, {(t, 0): Evict("offload", early=True)}, touch)


def test_prefetches_are_one_layer_ahead_unless_the_arena_has_no_room(vgg):
    """Within 12 GiB, each of vDNN_all's prefetches is issued one layer ahead (its ``lead`` as the
    rule asks) or, where shorter, the arena had no room for it one step earlier."""
    touch, cost = touches(vgg), ProfileCost(PROFILE)
    options = algorithm_options(vgg, cost)
    algos = memory_optimal(options, fastest(options))
    limit = BUDGET - vgg.persistent_bytes
    facts = Facts(vgg, touch)
    asked = layerwise_offloads(facts)
    timing = Prefetching(facts, asked, algos)
    fast = Prefetching(facts, asked, fastest(options))       # the same curve, from other algorithms
    assert (fast.with_algorithms(algos) == timing.curve).all()
    fitted, need = timing.fit(limit)
    assert live_bytes(facts, fitted, algos) <= need <= limit     # (need: at least what the lowering holds)
    curve = step_curve(lower(vgg, fitted, touch, algos), len(vgg.steps))
    shortened = 0
    for (t, g), e in fitted.items():
        a, b = touch[t][g], touch[t][g + 1]
        ask = min(asked[t, g].lead, b - a - 1)
        assert 0 <= e.lead <= ask
        if e.lead < ask:
            shortened += 1
            assert curve[b - e.lead - 1] + int(vgg.tensor_bytes[t]) > limit
    assert shortened, "VGG-16 b256's first block leaves no room for its conv input one layer ahead"
    # with no limit, every prefetch is one layer ahead
    assert timing.fit(float("inf"))[0] == asked


def test_one_layer_ahead_counts_an_in_place_activation_with_its_layer(vgg):
    """VGG's conv+ReLU is one layer (Caffe and Torch run the ReLU in place): the input of a
    convolution is prefetched as the backward of the layer after it starts, not during the
    backward of its own ReLU."""
    facts = Facts(vgg)
    touch, f = facts.touch, Layers(facts)
    label = {s.index: s.label for s in vgg.steps}
    for (t, g), e in layerwise_offloads(facts, convs_only=True).items():
        b = touch[t][g + 1]
        if vgg.steps[b].node.op.name != "conv2d" or b - 1 not in f.layer or f.layer[b - 1] != f.layer[b]:
            continue                          # (a convolution with an in-place ReLU after it)
        assert "relu" in label[b - 1] and e.lead >= 2, label[b]
