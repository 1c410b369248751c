"""Exact vs per-sub-batch BatchNorm under a budget that forces sub-batching: planning time, step time, peaks.

    python scripts/bench_exact_bn.py [--model resnet18_cifar] [--widths 16,32,64,128] [--batch-size 16]
                                     [--budget 0.9] [--steps 5]

``--budget`` is a fraction of the full batch's minimum (the smallest budget at
which the unsplit step fits), so both modes must split. Steps of the three
trainers (unlimited, per-sub-batch, exact) alternate, so machine noise hits all
alike; medians are reported, with each split run's difference from the
unlimited run after the steps (all parameters, all running statistics, and the
worst single entry: in float32 a BatchNorm bias, whose gradient sum(gy) cancels,
so its last bits depend on every convolution's summation order).
"""
from __future__ import annotations

import argparse
import statistics
import time

import minidnn as mdn  # before NumPy: it sets OpenBLAS's thread timeout, read when NumPy loads OpenBLAS
import numpy as np

from minidnn import models, nn, optim


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18_cifar")
    ap.add_argument("--widths", default="16,32,64,128", help="stage widths of a ResNet ('' for the model's own)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--budget", type=float, default=0.9)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    args = ap.parse_args()
    kw = {"widths": tuple(int(w) for w in args.widths.split(","))} if args.widths else {}
    shape = (args.batch_size, *models.default_input(args.model))

    def make(memory):
        net = models.get(args.model, **kw).init_parameters(0)
        t = time.perf_counter()
        tr = mdn.compile(net, shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.01, momentum=0.9), memory=memory,
                         dtype=np.dtype(args.dtype), trace_every=0)
        return tr, time.perf_counter() - t

    try:
        make(mdn.MemoryConfig(budget=1, sub_batching=False))
    except mdn.MemoryBudgetError as e:
        budget = int(args.budget * e.minimum_bytes)
        print(f"full-batch minimum {mdn.memory.format_bytes(e.minimum_bytes)}; budget "
              f"{mdn.memory.format_bytes(budget)} ({args.budget:.0%} of it)")
    modes = {"unlimited": None, "per sub-batch": mdn.MemoryConfig(budget=budget, bn="sub-batch"),
             "exact": mdn.MemoryConfig(budget=budget, bn="exact")}
    trainers, plan_s = {}, {}
    for name, mem in modes.items():
        trainers[name], plan_s[name] = make(mem)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, 10, args.batch_size)
    times = {name: [] for name in trainers}
    for i in range(args.steps + 1):
        for name, tr in trainers.items():
            t = time.perf_counter()
            tr.step(x, y)
            if i:
                times[name].append(time.perf_counter() - t)
    state = {name: {k: np.asarray(v, np.float64) for k, v in tr.net.state_dict().items()
                    if not k.endswith("num_batches_tracked")} for name, tr in trainers.items()}
    ref = state["unlimited"]

    def rel(names, got):
        return (np.sqrt(sum(np.sum((got[n] - ref[n]) ** 2) for n in names)) /
                np.sqrt(sum(np.sum(ref[n] ** 2) for n in names)))

    params = [n for n in ref if not n.endswith(("running_mean", "running_var"))]
    stats = [n for n in ref if n.endswith(("running_mean", "running_var"))]
    base = statistics.median(times["unlimited"])
    print(f"{args.model} widths {args.widths or 'default'}, batch {args.batch_size}, {args.dtype}, "
          f"median of {args.steps} steps")
    print("| BatchNorm | sub-batches | compile (plan) | step | vs unlimited | plan peak = measured | "
          "rel. difference from unlimited after the steps: parameters, running stats, worst entry |")
    print("|---|---|---|---|---|---|---|")
    for name, tr in trainers.items():
        med = statistics.median(times[name])
        k = getattr(tr.plan, "k", 1)
        got = state[name]
        worst = max(ref, key=lambda n: np.linalg.norm(got[n] - ref[n]) / (np.linalg.norm(ref[n]) or 1.0))
        worst_rel = np.linalg.norm(got[worst] - ref[worst]) / (np.linalg.norm(ref[worst]) or 1.0)
        same = "yes" if tr.measured_peak_bytes == tr.plan.peak_bytes else f"no ({tr.measured_peak_bytes})"
        print(f"| {name} | {k} | {plan_s[name]:.1f} s | {med * 1e3:.0f} ms | {med / base:.2f} | "
              f"{mdn.memory.format_bytes(tr.plan.peak_bytes)} {same} | {rel(params, got):.1e}, {rel(stats, got):.1e}, "
              f"{worst_rel:.1e} ({worst}) |")


if __name__ == "__main__":
    main()
