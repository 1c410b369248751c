"""ResNet-50 training-step time on one GPU: minidnn unlimited and under budgets, beside PyTorch.

    python scripts/bench_cuda.py [--batch-size 64] [--image-size 224] [--steps 10] [--out DIR]

Each configuration runs ``--warmup`` steps, then ``--steps`` timed steps (the median is
reported). Both frameworks take the batch from host NumPy arrays every step and read the
loss back (a synchronisation), and both let cuDNN use TF32 for float32 convolutions
(PyTorch's default). Budgets are fractions of minidnn's liveness peak. Writes
``cuda_bench.json`` and ``cuda_bench.txt`` to ``--out`` (default ``$OUT``, else ``.``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import minidnn as mdn  # noqa: E402  before NumPy: it sets OpenBLAS's thread timeout, read when NumPy loads OpenBLAS
import numpy as np  # noqa: E402
from minidnn import models, nn, optim  # noqa: E402


def batches(args, n):
    rng = np.random.default_rng(0)
    shape = (args.batch_size, 3, args.image_size, args.image_size)
    return [(rng.standard_normal(shape).astype(np.float32), rng.integers(0, 1000, args.batch_size)) for _ in range(n)]


def timed(step, data, warmup, steps):
    for x, y in data[:warmup]:
        step(x, y)
    ts = []
    for i in range(steps):
        x, y = data[(warmup + i) % len(data)]
        t = time.perf_counter()
        step(x, y)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def bench_minidnn(args, budget, data):
    from minidnn.backend.cuda import create
    backend = create(tf32=True)
    net = models.get("resnet50").init_parameters(0)
    t0 = time.perf_counter()
    trainer = mdn.compile(net, data[0][0].shape, nn.CrossEntropyLoss(),
                          optim.SGD(lr=0.01, momentum=0.9, weight_decay=1e-4), device=backend,
                          memory=mdn.MemoryConfig(budget=budget, profile="measured"), trace_every=0)
    compile_s = time.perf_counter() - t0
    plan = trainer.plan
    sec = timed(trainer.step, data, args.warmup, args.steps)
    return {"seconds": sec, "compile_seconds": compile_s, "budget_bytes": plan.budget,
            "plan_peak_bytes": plan.peak_bytes, "measured_peak_bytes": trainer.measured_peak_bytes,
            "liveness_peak_bytes": plan.liveness_peak_bytes, "sub_batches": getattr(plan, "k", 1),
            "evictions": len(getattr(plan, "evictions", {}) or {}),
            "algorithm_changes": len(getattr(plan, "algorithm_changes", []) or [])}


def torch_resnet50(torch):
    try:
        import torchvision
        return torchvision.models.resnet50(num_classes=1000)
    except ImportError:
        pass
    tnn = torch.nn

    class Bottleneck(tnn.Module):
        def __init__(self, cin, width, stride, down):
            super().__init__()
            self.conv1, self.bn1 = tnn.Conv2d(cin, width, 1, bias=False), tnn.BatchNorm2d(width)
            self.conv2, self.bn2 = tnn.Conv2d(width, width, 3, stride, 1, bias=False), tnn.BatchNorm2d(width)
            self.conv3, self.bn3 = tnn.Conv2d(width, width * 4, 1, bias=False), tnn.BatchNorm2d(width * 4)
            self.relu = tnn.ReLU(inplace=True)
            self.downsample = tnn.Sequential(tnn.Conv2d(cin, width * 4, 1, stride, bias=False),
                                             tnn.BatchNorm2d(width * 4)) if down else None

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    layers, cin = [tnn.Conv2d(3, 64, 7, 2, 3, bias=False), tnn.BatchNorm2d(64), tnn.ReLU(inplace=True),
                   tnn.MaxPool2d(3, 2, 1)], 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            layers.append(Bottleneck(cin, width, stride if b == 0 else 1, b == 0))
            cin = width * 4
    layers += [tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(2048, 1000)]
    return tnn.Sequential(*layers)


def bench_torch(args, data):
    try:
        import torch
    except ImportError:
        return {"skipped": "torch is not installed"}
    if not torch.cuda.is_available():
        return {"skipped": f"torch {torch.__version__} has no CUDA device"}
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    net = torch_resnet50(torch).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(torch.from_numpy(x).cuda(non_blocking=False)), torch.from_numpy(y).cuda())
        loss.backward()
        opt.step()
        return loss.item()

    sec = timed(step, data, args.warmup, args.steps)
    return {"seconds": sec, "version": torch.__version__, "max_memory_allocated": torch.cuda.max_memory_allocated()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--budgets", default="none,0.5,0.25", help="comma-separated: none or fractions of the liveness peak")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args(argv)
    data = batches(args, 4)
    report = {"model": "resnet50", "batch_size": args.batch_size, "image_size": args.image_size,
              "steps": args.steps, "torch": bench_torch(args, data), "minidnn": {}}
    for b in args.budgets.split(","):
        budget = None if b == "none" else float(b)
        try:
            report["minidnn"][b] = bench_minidnn(args, budget, data)
        except Exception as e:   # one configuration failing must not lose the others' numbers
            report["minidnn"][b] = {"error": f"{type(e).__name__}: {e}"}
        print(b, report["minidnn"][b], flush=True)
    lines = [f"ResNet-50, batch {args.batch_size}, {args.image_size}x{args.image_size}, median of {args.steps} steps"]
    t = report["torch"].get("seconds")
    lines.append(f"  pytorch: {t * 1e3:.1f} ms/step" if t else f"  pytorch: {report['torch'].get('skipped')}")
    free = report["minidnn"].get("none", {}).get("seconds")
    for b, r in report["minidnn"].items():
        if "seconds" not in r:
            lines.append(f"  minidnn budget {b}: {r.get('error')}")
            continue
        rel = [f"{r['seconds'] / t:.2f}x pytorch" if t else None,
               f"{r['seconds'] / free - 1:+.1%} vs unlimited" if free and b != "none" else None]
        lines.append(f"  minidnn budget {b}: {r['seconds'] * 1e3:.1f} ms/step ({', '.join(x for x in rel if x)}); "
                     f"peak {r['plan_peak_bytes'] / 2**30:.2f} GiB (measured {r['measured_peak_bytes'] / 2**30:.2f}), "
                     f"sub-batches {r['sub_batches']}")
    if t and free:
        lines.append(f"  targets: unlimited <= 1.1x pytorch: {'met' if free <= 1.1 * t else 'NOT met'}")
    half = report["minidnn"].get("0.5", {}).get("seconds")
    if free and half:
        lines.append(f"  targets: <= 5% overhead at 50%: {'met' if half <= 1.05 * free else 'NOT met'}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cuda_bench.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(args.out, "cuda_bench.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
