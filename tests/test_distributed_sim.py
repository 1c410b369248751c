"""Predicted data-parallel training: the all-reduce cost, the communication stream, the budget.

Everything here plans and simulates (CIFAR ResNet-20, shapes only); no kernel
runs. Links slower than any profile's make the reductions long enough that
the order of events is visible in the timeline.
"""
import dataclasses
import json

import pytest

from minidnn import cli, models
from minidnn.distributed.buckets import gradient_buckets
from minidnn.memory import MemoryConfig, plan_memory
from minidnn.memory.dataparallel import predict
from minidnn.memory.profiles import SYSTEMS, Interconnect
from minidnn.memory.subbatch import plan_sub_batches
from minidnn.report import shapes_only, sub_batch_schedules, training_schedule
from minidnn.schedule import PARAM_GRAD

SHAPE = (64, 3, 32, 32)


def buckets_of(schedule):
    """The schedule's gradient buckets (cut small: ResNet-20's gradients are 1 MiB), as tensor ids."""
    return [b.grads for b in gradient_buckets(schedule, bucket_bytes=128 << 10, tail_bytes=32 << 10)]


def system_with(name, **link):
    """System ``name`` with its one-node link changed by ``link``."""
    s = SYSTEMS[name]
    return dataclasses.replace(s, intra=dataclasses.replace(s.intra, **link))


@pytest.fixture(scope="module")
def net():
    with shapes_only():
        return models.get("resnet20")


@pytest.fixture(scope="module")
def schedule(net):
    return training_schedule(net, SHAPE)[1]


@pytest.fixture(scope="module")
def plans(schedule):
    """budget -> the plan on the V100 profile (unlimited, and half the liveness peak)."""
    return {b: plan_memory(schedule, MemoryConfig(budget=b, profile="v100-16gb")) for b in (None, 0.5)}


def test_ring_allreduce_cost_against_a_hand_computation():
    link = Interconnect("x", "test", bandwidth=10e9, latency=5e-6, shares_host_link=False, efficiency=0.5)
    # 2 (p - 1) / p * n / (bw * eff) + 2 (p - 1) * latency, for n = 1e8 bytes over p = 4
    assert link.allreduce_seconds(10**8, 4) == pytest.approx(2 * 3 / 4 * 1e8 / 5e9 + 6 * 5e-6, rel=1e-12)
    assert link.allreduce_seconds(10**8, 4) == pytest.approx(0.03003, rel=1e-12)
    assert link.allreduce_seconds(10**8, 1) == 0.0
    two = SYSTEMS["a100-2x8-100g"]
    assert two.link(8).name == "nvlink3" and two.link(9).name == "net100g"   # a ring across nodes
    with pytest.raises(ValueError, match="16 devices"):
        two.link(17)


def test_one_rank_predicts_the_single_process_time(plans, schedule):
    for plan in plans.values():
        pred = predict(plan, buckets_of(schedule), "v100-pcie3", 1)
        assert sum(s.kind == "reduce" for s in pred.program.steps) == len(buckets_of(schedule))
        assert pred.seconds == plan.simulation.seconds
        assert pred.speedup == 1.0 and pred.exposed_seconds == 0.0


def test_an_update_starts_after_its_own_reduction_only(plans, schedule):
    slow = system_with("v100-pcie3", bandwidth=2e8)      # reductions outlast the backward
    buckets = buckets_of(schedule)
    pred = predict(plans[None], buckets, slow, 4)
    prog, sim = pred.program, pred.simulation
    reduced = {}                              # gradient -> end of its bucket's reduction
    for i, s in enumerate(prog.steps):
        if s.kind == "reduce":
            assert sim.stream[i] == "comm"
            last_write = max(j for j in range(i) if set(prog.steps[j].writes + prog.steps[j].updates) & set(s.updates)
                             and prog.steps[j].kind != "reduce")
            assert sim.start[i] >= sim.end[last_write]        # not before its last gradient is written
            reduced.update(dict.fromkeys(s.updates, sim.end[i]))
    updates = [i for i, s in enumerate(prog.steps) if s.kind == "update"]
    assert updates and all(sim.start[i] >= reduced[prog.steps[i].reads[0]] for i in updates)
    # the first bucket's updates run while the last bucket is still being reduced
    assert sim.start[updates[0]] < max(reduced.values())
    assert pred.exposed_seconds > 0 and pred.efficiency < 1


def test_backward_longer_than_communication_hides_it(plans, schedule):
    plan = plans[None]
    buckets = buckets_of(schedule)
    pred = predict(plan, buckets, "a100-nvlink", 8)
    link = SYSTEMS["a100-nvlink"].link(8)
    backward = sum(c for c, s in zip(pred.simulation.costs, pred.program.steps) if s.kind == "backward")
    assert 0 < pred.simulation.comm_seconds < backward
    tail = link.allreduce_seconds(pred.bucket_bytes[-1], 8)    # the last bucket: ready when the backward ends
    assert pred.seconds - pred.single_seconds <= tail + 1e-12
    assert pred.seconds < pred.single_seconds + 0.5 * pred.simulation.comm_seconds


def test_offload_contending_on_the_host_link_is_no_faster(plans, schedule):
    plan = plans[0.5]
    assert plan.simulation.copy_seconds > 0
    buckets = buckets_of(schedule)
    for bandwidth in (2e8, 2e9, 12e9):
        shared = predict(plan, buckets, system_with("v100-pcie3", bandwidth=bandwidth), 4)
        apart = predict(plan, buckets, system_with("v100-pcie3", bandwidth=bandwidth, shares_host_link=False), 4)
        assert shared.seconds >= apart.seconds
    # where the reductions are long, the copies queue behind them: the compute stalls more
    assert shared.simulation.stall_seconds >= apart.simulation.stall_seconds
    slow_shared = predict(plan, buckets, system_with("v100-pcie3", bandwidth=2e8), 4)
    slow_apart = predict(plan, buckets, system_with("v100-pcie3", bandwidth=2e8, shares_host_link=False), 4)
    assert slow_shared.seconds > slow_apart.seconds


def test_the_budget_holds_with_ranks(plans, schedule):
    plan = plans[0.5]
    buckets = buckets_of(schedule)
    for ranks in (2, 8):
        pred = predict(plan, buckets, "v100-pcie3", ranks)
        assert pred.peak_bytes == plan.peak_bytes <= plan.budget
        grads = [t for t in plan.schedule.tensors if t.category == PARAM_GRAD]
        assert sorted(t for b in pred.buckets for t in b) == sorted(t.id for t in grads)
        assert sum(pred.bucket_bytes) == sum(t.nbytes for t in grads)
        assert max(pred.simulation.memory) == max(plan.simulation.memory)
        sizes = pred.program.tensor_bytes
        for i in range(len(pred.program.steps)):     # no two buffers live at one step share a byte
            live = sorted((off, off + int(sizes[r.tensor])) for r, off in zip(pred.program.residencies,
                                                                             plan.offsets) if r.start <= i <= r.end)
            assert all(end <= start for (_, end), (start, _) in zip(live, live[1:]))


def test_sub_batches_reduce_once_per_mini_batch(net):
    schedules_for = sub_batch_schedules(net, SHAPE)
    full = plan_memory(training_schedule(net, SHAPE)[1], MemoryConfig(profile="v100-16gb"))
    split = plan_sub_batches(SHAPE[0], schedules_for, MemoryConfig(budget=int(0.6 * full.peak_bytes),
                                                                   profile="v100-16gb"))
    assert split.k >= 2
    buckets = buckets_of(split.sub.schedule)
    one = predict(split, buckets, "v100-pcie3", 1)
    assert one.seconds == pytest.approx(split.predicted_seconds, rel=1e-12)
    pred = predict(split, buckets, "v100-pcie3", 4)
    assert sum(s.kind == "reduce" for s in pred.program.steps) == len(buckets)
    link = SYSTEMS["v100-pcie3"].link(4)
    once = sum(link.allreduce_seconds(n, 4) for n in pred.bucket_bytes)
    assert pred.simulation.comm_seconds == pytest.approx(once, rel=1e-12)
    assert one.seconds < pred.seconds < one.seconds + once


def test_plan_with_ranks_predicts_scaling(capsys):
    argv = ["plan", "--model", "resnet20", "--batch-size", "256", "--profile", "v100-pcie3", "--ranks", "4"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "4 ranks" in out and "64 per rank" in out and "scaling efficiency" in out
    assert cli.main(argv + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["input_shape"][0] == 64 and d["data_parallel"]["ranks"] == 4
    dp = d["data_parallel"]
    assert dp["step_seconds"] >= dp["single_device_seconds"] == pytest.approx(d["prediction"]["step_seconds"])
    assert 0 < dp["efficiency"] <= 1 and dp["speedup"] == pytest.approx(4 * dp["efficiency"])
    for bad in (["--ranks", "3"], ["--ranks", "16"], ["--ranks", "2", "--profile", "titanx-12gb"]):
        assert cli.main(argv[:-4] + ["--profile", "v100-pcie3"] + bad) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("minidnn: error: ")
