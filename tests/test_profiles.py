"""Device profiles per precision (memory/profiles.py, memory/costmodel.py): the calibration to NVIDIA's
published ResNet-50 throughput reproduces within +-10% (scripts/calibrate_profiles.py), TF32 is never
slower than FP32, and the profiles of before keep every FP32 figure exactly."""
import json
import os
import sys

import pytest

from minidnn import models
from minidnn.memory import MemoryConfig, plan_memory
from minidnn.memory.costmodel import ProfileCost
from minidnn.memory.planner import algorithm_options
from minidnn.memory.profiles import FP32_FIT, PRECISIONS, PROFILES, TENSOR_FIT, get_profile, get_system
from minidnn.memory.simulator import simulate
from minidnn.report import make_plan, shapes_only, training_schedule

from test_cli import one_line_error, run

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import calibrate_profiles as calibration  # noqa: E402

# profiles whose FP32 figures the README's tables and the planner's tests rest on
OLD = ("titanx-12gb", "k40-12gb", "p100-16gb", "v100-16gb", "a100-40gb", "h100-80gb", "h200-141gb", "cpu-2core")
SXM = ("v100-sxm2-16gb", "a100-sxm4-80gb", "h100-sxm5-80gb")


@pytest.fixture(scope="module")
def resnet50():
    """batch -> ResNet-50's training schedule at 224x224 (shapes only), for the batches of the fit."""
    return {b: calibration.resnet50_schedule(b) for b in sorted({c[2] for c in calibration.PUBLISHED})}


def small_schedule():
    with shapes_only():
        net = models.get("resnet18")
    return training_schedule(net, (4, 3, 64, 64))[1]


def test_calibration_reproduces_the_published_throughput_within_ten_percent(resnet50):
    for profile, precision, batch, published, what in calibration.PUBLISHED:
        predicted = calibration.images_per_second(resnet50[batch], profile, precision)
        assert abs(predicted / published - 1) <= 0.10, (what, predicted, published)
        # the figure is the planner's: its unlimited-memory plan simulates the same step
        planned = calibration.planned_images_per_second(resnet50[batch], profile, precision)
        assert planned == pytest.approx(predicted, rel=1e-9)


def test_the_written_efficiencies_are_the_fit(resnet50):
    fp32, tensor = calibration.fit(resnet50)
    assert FP32_FIT == pytest.approx(fp32, abs=5e-5)            # written to 4 decimals
    for p in ("tf32", "fp16", "bf16"):
        assert TENSOR_FIT.of(p) == pytest.approx(tensor.of(p), abs=5e-5)
    assert all(get_profile(name).efficiency == FP32_FIT for name in SXM)


def test_tf32_is_never_slower_than_fp32():
    """Per step and per algorithm, on every profile: allowing TF32 never forbids the FP32 kernel."""
    sched = small_schedule()
    for name in PROFILES:
        fp32, tf32 = ProfileCost(name, "fp32"), ProfileCost(name, "tf32")
        for s in sched.steps:
            assert tf32.step_seconds(sched, s) <= fp32.step_seconds(sched, s), (name, s.label)
        for i, options in algorithm_options(sched, fp32).items():
            s = sched.steps[i]
            for _, algo in options:
                assert tf32.step_seconds(sched, s, algo) <= fp32.step_seconds(sched, s, algo), (name, s.label)


def test_tf32_speeds_up_only_devices_with_tf32_tensor_cores():
    sched = small_schedule()
    for name in PROFILES:
        fp32, tf32 = ProfileCost(name, "fp32"), ProfileCost(name, "tf32")
        same = all(tf32.step_seconds(sched, s) == fp32.step_seconds(sched, s) for s in sched.steps)
        assert same == (get_profile(name).tensor_peaks.tf32 is None), name


def test_the_old_profiles_keep_their_fp32_figures(resnet50):
    """ResNet-50 b256's unlimited step on the profiles of before, to the last bit (the figures of
    ``minidnn plan --model resnet50 --batch-size 256 --image-size 224 --profile P`` before
    precisions), and fp32 is every profile's default."""
    before = {"titanx-12gb": 2.1881224762932807, "v100-16gb": 0.9294306461487921,
              "a100-40gb": 0.6353014567517351, "h100-80gb": 0.29630369127264283}
    sched = resnet50[256]
    for name, seconds in before.items():
        assert get_profile(name).precision == "fp32"
        assert calibration.step_seconds(sched, name, "fp32") == seconds
        assert plan_memory(sched, MemoryConfig(profile=name)).simulation.seconds == seconds
    for name in OLD:
        prof = get_profile(name)
        assert (prof.efficiency, prof.memory_efficiency) == ((0.5, 0.8) if name == "cpu-2core" else (0.6, 0.8))


def test_sxm_profiles_have_their_host_links():
    """PCIe 3.0, 4.0 and 5.0 x16 (16, 32, 64 GB/s per direction, x 0.75 as the PCIe profiles)."""
    links = [get_profile(name).link_bandwidth for name in SXM]
    assert links == [16e9 * 0.75, 32e9 * 0.75, 64e9 * 0.75]
    assert [get_profile(name).link_bandwidth for name in ("v100-16gb", "a100-40gb", "h100-80gb")] == links


def test_half_precision_halves_the_bytes_of_bandwidth_bound_steps_not_the_update():
    sched = small_schedule()
    fp32, bf16 = ProfileCost("a100-sxm4-80gb", "fp32"), ProfileCost("a100-sxm4-80gb", "bf16")
    for s in sched.steps:
        if s.kind == "update":
            assert bf16.step_seconds(sched, s) == fp32.step_seconds(sched, s)
        elif s.kind != "load":
            assert bf16.step_seconds(sched, s) <= fp32.step_seconds(sched, s), s.label
    # V100 has no BF16 tensor cores: its convolutions run at FP32, only the bytes shrink
    v100 = get_profile("v100-sxm2-16gb")
    assert v100.tensor_peaks.bf16 is None and v100.tensor_peaks.fp16 == 125e12


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision"):
        get_profile("a100-sxm4-80gb").at_precision("fp8")
    with pytest.raises(ValueError, match="precision"):
        ProfileCost("a100-sxm4-80gb", "int8")
    assert set(PRECISIONS) == {"fp32", "tf32", "fp16", "bf16"}
    sys_tf32 = get_system("a100-nvlink").at_precision("tf32")
    assert sys_tf32.device.precision == "tf32" and sys_tf32.device.name == "a100-40gb"
    assert get_profile("titanx-12gb").at_precision("fp32") is get_profile("titanx-12gb")


def test_plan_takes_every_precision(capsys):
    """TF32 is faster than FP32 at the same bytes; mixed precision (a GPU's kernels read the 2-byte
    activations, no staging through fp32 as on the CPU backend) holds at most 0.55 of fp32's arena
    and is faster than TF32 on the tensor cores."""
    args = ("plan", "--model", "resnet20", "--batch-size", 64, "--profile", "a100-sxm4-80gb", "--json")
    out = {}
    for p in ("fp32", "tf32", "bf16", "fp16"):
        rc, text, err = run(capsys, *args, "--precision", p)
        assert rc == 0, err
        out[p] = json.loads(text)
        assert out[p]["precision"] == p
    seconds = {p: d["prediction"]["step_seconds"] for p, d in out.items()}
    assert seconds["tf32"] < seconds["fp32"] and out["tf32"]["arena_bytes"] == out["fp32"]["arena_bytes"]
    for p in ("bf16", "fp16"):
        assert seconds[p] < seconds["tf32"]
        assert out[p]["arena_bytes"] <= 0.55 * out["fp32"]["arena_bytes"]
        assert out[p]["persistent_bytes"] == out["fp32"]["persistent_bytes"]   # fp32 master weights


def test_a_budgeted_tf32_plan_states_its_floor_at_tf32(capsys):
    """The floor printed beside a TF32 plan is TF32's (the profile travels, not its name)."""
    rc, out, err = run(capsys, "plan", "--model", "resnet20", "--batch-size", 64, "--budget", "0.5",
                       "--profile", "a100-sxm4-80gb", "--precision", "tf32", "--json")
    d = json.loads(out)
    assert rc == 0 and d["prediction"]["floor_seconds"] is not None
    assert d["prediction"]["floor_seconds"] <= d["prediction"]["step_seconds"] * (1 + 1e-9)
    assert d["prediction"]["unlimited_memory_seconds"] <= d["prediction"]["floor_seconds"] * (1 + 1e-9)


def test_a_plan_replayed_in_tf32_is_never_slower_than_in_fp32():
    """The same program (offloads, prefetches, recomputations, algorithms) simulated with TF32's step
    times: no stream waits longer. (The planner's own TF32 plan is another search, not asserted.)"""
    plan, _ = make_plan("resnet20", 64, None, 0.5, "auto", get_profile("a100-sxm4-80gb"))
    replay = {p: simulate(plan.program, plan.schedule, ProfileCost("a100-sxm4-80gb", p), algos=plan.algos).seconds
              for p in ("fp32", "tf32")}
    assert replay["fp32"] == plan.simulation.seconds
    assert replay["tf32"] < replay["fp32"]
