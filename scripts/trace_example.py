"""The README's memory picture: ResNet-18 (CIFAR) at batch 64 under 60% of its liveness peak.

    python scripts/trace_example.py [--out docs] [--budget 0.6] [--batch-size 64]

Trains two steps on synthetic data on the CPU backend and writes the second
step's trace (trace.json, memory.png, memory_snapshot.pickle, memory.csv).
"""
from __future__ import annotations

import argparse

import minidnn as mdn  # before NumPy: it sets OpenBLAS's thread timeout, read when NumPy loads OpenBLAS
import numpy as np

from minidnn import models, nn, optim
from minidnn.trace import stats


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs")
    ap.add_argument("--budget", default="0.6")
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args()
    shape = (args.batch_size, 3, 32, 32)
    net = models.get("resnet18_cifar").init_parameters(0)
    trainer = mdn.compile(net, shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.05, momentum=0.9),
                          memory=mdn.MemoryConfig(budget=args.budget))
    print(trainer.plan.summary(top=0))
    rng = np.random.default_rng(0)
    for _ in range(2):
        trainer.step(rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, args.batch_size))
    st = stats(trainer.trace)
    print({k: st[k] for k in ("offloads_overlapping_forward", "prefetches_in_backward") if k in st})
    print("\n".join(trainer.save_trace(args.out)))


if __name__ == "__main__":
    main()
