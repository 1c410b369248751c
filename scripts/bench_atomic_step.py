"""Cost of all-or-nothing steps: a step with its transaction and without, in one run.

    python scripts/bench_atomic_step.py [--model resnet20] [--batch-size 32] [--steps 15] [--budget none]

Alternates ``trainer.step`` (the network's arrays adopted, the buffers saved,
SIGINT held over the step and polled between its program steps) with the same step run bare, on one trainer, so
machine noise hits both alike; prints the median of each, their ratio, and the
transaction's own cost timed alone (adopt, save, hold and release, one poll).
"""
from __future__ import annotations

import argparse
import statistics
import time

import minidnn as mdn  # before NumPy: it sets OpenBLAS's thread timeout, read when NumPy loads OpenBLAS

from minidnn import models, nn, optim
from synthetic import synthetic_batch
from minidnn.transaction import InterruptGuard, Step, atomic_step


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--budget", default="none")
    args = ap.parse_args()
    shape, x, y = synthetic_batch(args.model, args.batch_size)
    trainer = mdn.compile(models.get(args.model).init_parameters(0), shape, nn.CrossEntropyLoss(),
                          optim.SGD(lr=0.01, momentum=0.9), trace_every=0,
                          memory=None if args.budget == "none" else args.budget)
    bare_txn = Step(InterruptGuard())          # never holds: the executor's polls find nothing
    runs = {"bare": (lambda: trainer._step(x, y, bare_txn), []), "atomic": (lambda: trainer.step(x, y), [])}
    for i in range(args.steps + 2):
        for name in ("bare", "atomic") if i % 2 else ("atomic", "bare"):   # either first as often
            fn, times = runs[name]
            t = time.perf_counter()
            fn()
            if i >= 2:
                times.append(time.perf_counter() - t)
    bare, atomic = runs["bare"][1], runs["atomic"][1]
    fixed = []
    for _ in range(200):
        t = time.perf_counter()
        trainer.store.adopt()
        with atomic_step(trainer.store, trainer.rng) as txn:
            txn.poll()
            txn.commit()
        fixed.append(time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(10000):
        bare_txn.poll()
    poll = (time.perf_counter() - t) / 10000
    n = len(trainer.plan.steps)
    b, a, f = statistics.median(bare), statistics.median(atomic), statistics.median(fixed)
    print(f"{args.model} batch {args.batch_size} budget {args.budget}: bare {b * 1e3:.2f} ms, atomic {a * 1e3:.2f} ms, "
          f"ratio {a / b:.4f} (median of {args.steps}; of the fastest: {min(atomic) / min(bare):.4f}); "
          f"transaction alone {f * 1e6:.1f} us + {n} polls of "
          f"{poll * 1e9:.0f} ns = {(f + n * poll) / b * 100:.3f}% of a step; "
          f"buffers saved {trainer.store.buffers.nbytes} B")


if __name__ == "__main__":
    main()
