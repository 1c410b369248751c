"""Step time under a budget vs unlimited memory on the CPU backend, measured and predicted, in one run.

    python scripts/bench_budget_cpu.py [--model resnet18_cifar] [--batch-size 64] [--budgets 0.6,0.4] [--steps 5]

Each trainer profiles its own steps first (MemoryConfig(profile="measured")),
so the simulator's prediction uses this machine's times. Steps of the
trainers alternate, so machine noise hits all alike; medians are reported.
"""
from __future__ import annotations

import argparse
import statistics
import time

import minidnn as mdn  # before NumPy: it sets OpenBLAS's thread timeout, read when NumPy loads OpenBLAS

from minidnn import models, nn, optim
from synthetic import synthetic_batch
from minidnn.memory import Plan


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18_cifar")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--budgets", default="0.6,0.4")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    shape, x, y = synthetic_batch(args.model, args.batch_size)
    budgets = [None] + [float(b) for b in args.budgets.split(",")]
    trainers = {}
    for b in budgets:
        net = models.get(args.model).init_parameters(0)
        trainers[b] = mdn.compile(net, shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.01, momentum=0.9),
                                  memory=mdn.MemoryConfig(budget=b, profile="measured"), trace_every=0)
    times = {b: [] for b in budgets}
    for i in range(args.steps + 1):
        for b, tr in trainers.items():
            t = time.perf_counter()
            tr.step(x, y)
            if i:
                times[b].append(time.perf_counter() - t)
    base = statistics.median(times[None])
    print(f"{args.model} batch {args.batch_size}, median of {args.steps} steps")
    print("| budget | plan peak | measured step | ratio | predicted step | predicted ratio |")
    print("|---|---|---|---|---|---|")
    for b, tr in trainers.items():
        med = statistics.median(times[b])
        plan = tr.plan
        sim = plan.predicted_seconds
        # predicted ratio: against the same trainer's replay with unlimited memory (its own measured
        # times; a split plan's against the unlimited trainer's)
        own = plan.baseline.seconds if isinstance(plan, Plan) and plan.baseline else trainers[None].plan.predicted_seconds
        name = "unlimited" if b is None else f"{b:.0%} of liveness peak"
        print(f"| {name} | {mdn.memory.format_bytes(plan.peak_bytes)} | {med * 1e3:.0f} ms | {med / base:.3f} | "
              f"{sim * 1e3:.0f} ms | {sim / own:.3f} |")


if __name__ == "__main__":
    main()
