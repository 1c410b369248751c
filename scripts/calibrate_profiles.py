"""Fit the GPU profiles' efficiencies to NVIDIA's published ResNet-50 training throughput, once.

    python scripts/calibrate_profiles.py [--no-plan]

Published (the figures fitted, nothing else): NVIDIA DeepLearningExamples,
PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "Training performance results", one GPU,
pytorch-21.03 NGC container:

    DGX-1 16GB (V100 SXM2 16 GB)   FP32  367 img/s   mixed precision 1200 img/s
    DGX A100 (A100 SXM4 80 GB)     TF32  938 img/s   mixed precision 2470 img/s

at the batch sizes of the same folder's configs.yml (models: resnet50: DGX1V FP32 112, DGX1V AMP
256, DGXA100 TF32 256, DGXA100 AMP 256). "Mixed precision" is FP16 autocast (AMP).

Predicted: the unlimited-memory training step of minidnn's ResNet-50 (v1.5, 224x224, SGD with
momentum) on the cost model (memory.costmodel.ProfileCost), as ``minidnn plan`` predicts it:
each step at its fastest convolution algorithm. Unknowns: the fraction of the peak that
convolutions and GEMMs reach, per precision (memory.profiles' FP32_FIT and TENSOR_FIT); the memory
efficiency stays 0.8 and the overhead per step 10 us, as in every GPU profile. FP32 and TF32 have
one figure each and are solved exactly; FP16 has two (V100 and A100) for one efficiency: least
squares of log(predicted / published). BF16 takes FP16's (the same tensor-core peak on A100 and
H100; the table has no BF16 figure).

It prints the fit beside the constants written in memory/profiles.py, then predicted against
published throughput with the written constants (within +-10% is the bar the tests hold), each
also planned by the planner (``plan_memory``, no budget) unless ``--no-plan``, and the
unfitted predictions of the H100 SXM5 and of the PCIe profiles for comparison.
"""
from __future__ import annotations

import argparse
import dataclasses
import math

import minidnn  # noqa: F401  (before NumPy: it sets OpenBLAS's thread timeout)
from scipy.optimize import brentq, minimize_scalar

from minidnn import models
from minidnn.memory import MemoryConfig, plan_memory
from minidnn.memory.costmodel import ProfileCost
from minidnn.memory.planner import algorithm_options
from minidnn.memory.profiles import FP32_FIT, TENSOR_FIT, TensorRates, get_profile
from minidnn.report import shapes_only, training_schedule

SOURCE = ("NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "
          "Training performance results (1 GPU, pytorch-21.03); batch sizes from ConvNets/configs.yml")

# (profile, precision, batch, published img/s, what was measured)
PUBLISHED = (
    ("v100-sxm2-16gb", "fp32", 112, 367.0, "DGX-1 16GB, 1x V100 SXM2, FP32"),
    ("v100-sxm2-16gb", "fp16", 256, 1200.0, "DGX-1 16GB, 1x V100 SXM2, mixed precision"),
    ("a100-sxm4-80gb", "tf32", 256, 938.0, "DGX A100, 1x A100 SXM4 80GB, TF32"),
    ("a100-sxm4-80gb", "fp16", 256, 2470.0, "DGX A100, 1x A100 SXM4 80GB, mixed precision"),
)

# predictions printed for comparison only (nothing published in the table above is fitted to them)
UNFITTED = (("h100-sxm5-80gb", "fp32", 256), ("h100-sxm5-80gb", "tf32", 256), ("h100-sxm5-80gb", "bf16", 256),
            ("v100-16gb", "fp32", 256), ("a100-40gb", "fp32", 256), ("a100-40gb", "tf32", 256),
            ("h100-80gb", "fp32", 256), ("h100-80gb", "tf32", 256))


def resnet50_schedule(batch):
    """The training schedule of ResNet-50 at ``batch`` x 3 x 224 x 224 (shapes only, no kernels)."""
    with shapes_only():
        net = models.get("resnet50")
    return training_schedule(net, (batch, 3, 224, 224))[1]


def step_seconds(schedule, profile, precision) -> float:
    """The unlimited-memory step: every step at its fastest algorithm (what ``plan_memory`` without
    a budget simulates: one stream, nothing to copy)."""
    cost = ProfileCost(profile, precision)
    fastest = algorithm_options(schedule, cost)
    return sum(fastest[s.index][0][0] if s.index in fastest else cost.step_seconds(schedule, s)
               for s in schedule.steps)


def images_per_second(schedule, profile, precision) -> float:
    return schedule.tensors[schedule.inputs[0]].spec.shape[0] / step_seconds(schedule, profile, precision)


def with_efficiencies(profile, fp32, tensor):
    return dataclasses.replace(get_profile(profile), efficiency=fp32, tensor_efficiency=tensor)


def fit(schedules):
    """(FP32 efficiency, TensorRates of tensor efficiencies) fitted to PUBLISHED; ``schedules``:
    batch -> schedule."""
    (v100, _, b32, fp32_ips, _), (_, _, b16v, v100_ips, _), (a100, _, b_tf32, tf32_ips, _), \
        (_, _, b16a, a100_ips, _) = PUBLISHED

    def solve(predict, published):   # the efficiency in (0, 1] at which the prediction meets the figure
        return brentq(lambda e: predict(e) - published, 1e-3, 1.0, xtol=1e-12)

    fp32 = solve(lambda e: images_per_second(schedules[b32], with_efficiencies(v100, e, TENSOR_FIT), "fp32"),
                 fp32_ips)
    tf32 = solve(lambda e: images_per_second(schedules[b_tf32], with_efficiencies(
        a100, fp32, TensorRates(tf32=e, fp16=1.0, bf16=1.0)), "tf32"), tf32_ips)

    def log_error(e):
        tensor = TensorRates(tf32=tf32, fp16=e, bf16=e)
        return sum(math.log(images_per_second(schedules[b], with_efficiencies(p, fp32, tensor), "fp16") / ips) ** 2
                   for p, b, ips in ((v100, b16v, v100_ips), (a100, b16a, a100_ips)))

    fp16 = minimize_scalar(log_error, bounds=(1e-3, 1.0), method="bounded", options={"xatol": 1e-9}).x
    return fp32, TensorRates(tf32=tf32, fp16=fp16, bf16=fp16)


def planned_images_per_second(schedule, profile, precision) -> float:
    """``minidnn plan``'s figure: the planner's unlimited-memory plan, simulated."""
    prof = get_profile(profile).at_precision(precision)
    plan = plan_memory(schedule, MemoryConfig(profile=prof))
    return schedule.tensors[schedule.inputs[0]].spec.shape[0] / plan.simulation.seconds


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-plan", action="store_true", help="skip the planner's check of each prediction")
    args = ap.parse_args(argv)
    schedules = {b: resnet50_schedule(b) for b in sorted({c[2] for c in PUBLISHED + UNFITTED})}
    fp32, tensor = fit(schedules)
    print(f"published: {SOURCE}")
    print(f"fit      : FP32 {fp32:.6f}   TF32 {tensor.tf32:.6f}   FP16 = BF16 {tensor.fp16:.6f}")
    print(f"written  : FP32 {FP32_FIT:.6f}   TF32 {TENSOR_FIT.tf32:.6f}   FP16 = BF16 {TENSOR_FIT.fp16:.6f}"
          "   (memory/profiles.py FP32_FIT, TENSOR_FIT)")
    print()
    head = f"{'profile':<16}{'precision':<11}{'batch':>6}{'published':>11}{'predicted':>11}{'ratio':>8}"
    print(head + ("" if args.no_plan else f"{'planned':>11}") + "   measured on")
    for profile, precision, batch, published, what in PUBLISHED:
        ips = images_per_second(schedules[batch], profile, precision)
        line = (f"{profile:<16}{precision:<11}{batch:>6}{published:>11.0f}{ips:>11.0f}"
                f"{(ips / published - 1) * 100:>+7.1f}%")
        if not args.no_plan:
            line += f"{planned_images_per_second(schedules[batch], profile, precision):>11.0f}"
        print(line + f"   {what}")
    print()
    print("not fitted (no figure of theirs above), for comparison:")
    for profile, precision, batch in UNFITTED:
        ips = images_per_second(schedules[batch], profile, precision)
        print(f"{profile:<16}{precision:<11}{batch:>6}{'-':>11}{ips:>11.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
