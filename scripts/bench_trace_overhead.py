"""Cost of recording memory timelines: step time with and without the recorder, in one run.

    python scripts/bench_trace_overhead.py [--model resnet20] [--batch-size 32] [--steps 15]

Alternates traced and untraced steps of two identical trainers (so machine noise
hits both alike) and prints the median of each and their ratio.
"""
from __future__ import annotations

import argparse
import statistics
import time

import minidnn as mdn  # before NumPy: it sets OpenBLAS's thread timeout, read when NumPy loads OpenBLAS

from minidnn import models, nn, optim
from synthetic import synthetic_batch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--budget", default="0.6")
    args = ap.parse_args()
    shape, x, y = synthetic_batch(args.model, args.batch_size)
    trainers = {every: mdn.compile(models.get(args.model).init_parameters(0), shape, nn.CrossEntropyLoss(),
                                   optim.SGD(lr=0.01, momentum=0.9), memory=args.budget, trace_every=every)
                for every in (0, 1)}
    times = {0: [], 1: []}
    for i in range(args.steps + 2):
        for every, tr in trainers.items():
            t = time.perf_counter()
            tr.step(x, y)
            if i >= 2:
                times[every].append(time.perf_counter() - t)
    off, on = statistics.median(times[0]), statistics.median(times[1])
    print(f"{args.model} batch {args.batch_size} budget {args.budget}: untraced {off * 1e3:.1f} ms, "
          f"traced {on * 1e3:.1f} ms, ratio {on / off:.3f} (median of {args.steps})")


if __name__ == "__main__":
    main()
