"""ResNet-50 training-step time on one GPU: minidnn unlimited and under budgets, beside PyTorch.

    python scripts/bench_cuda.py [--batch-size 64] [--image-size 224] [--steps 10] [--deadline S] [--out DIR]
                                 [--precisions fp32,tf32,bf16,fp16] [--budgets none,0.5,0.25]

Each configuration runs ``--warmup`` steps, then ``--steps`` timed steps (the median is
reported), in each of ``--precisions``: float32 with and without TF32 convolutions, and mixed
precision as torch.autocast (bf16; fp16 with dynamic loss scaling), where PyTorch runs
``torch.autocast("cuda", dtype)`` (and ``GradScaler`` for fp16). Both frameworks take the batch
from host NumPy arrays every step and read the loss back (a synchronisation). PyTorch runs
as its users run it, in a process of its own that never imports minidnn, with the environment
less what ``import minidnn`` sets (scripts/peers.py): at its defaults (``cudnn.benchmark``
off) before minidnn's configurations and with ``cudnn.benchmark`` on after them; the ratios
are against the faster. Budgets are fractions of minidnn's liveness peak. For each
configuration: measured and predicted ms per step, the plan's peak, and what the device
really holds (cudaMemGetInfo's used bytes since before the backend, CuPy's pool). Writes
``cuda_bench.json`` and ``cuda_bench.txt`` to ``--out`` (default ``$OUT``, else ``.``) after
every configuration, so a run stopped by a timeout keeps what it measured.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import peers  # noqa: E402  stdlib only: PyTorch's process (--peer-only) must not import minidnn


def batches(args, n):
    import numpy as np    # minidnn's process imports minidnn first (main): its OpenBLAS setting
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


def device_bytes():
    """(bytes used on the device by every process, as cudaMemGetInfo counts them; CuPy's pool's bytes
    in use and held)."""
    import cupy as cp
    free, total = cp.cuda.runtime.memGetInfo()
    pool = cp.get_default_memory_pool()
    return total - free, pool.used_bytes(), pool.total_bytes()


def release():
    """Give back what the previous configuration left in CuPy's pools, so the next one's device bytes are its own."""
    import gc

    import cupy as cp
    gc.collect()
    cp.get_default_memory_pool().free_all_blocks()
    cp.get_default_pinned_memory_pool().free_all_blocks()


def bench_minidnn(args, budget, precision, data):
    import minidnn as mdn
    from minidnn import models, nn, optim
    from minidnn.backend.cuda import create
    release()
    used0, _, _ = device_bytes()
    backend = create(tf32=precision == "tf32")
    net = models.get("resnet50").init_parameters(0)
    t0 = time.perf_counter()
    trainer = mdn.compile(net, data[0][0].shape, nn.CrossEntropyLoss(),
                          optim.SGD(lr=0.01, momentum=0.9, weight_decay=1e-4), device=backend,
                          memory=mdn.MemoryConfig(budget=budget, profile="measured"), trace_every=0,
                          precision=precision)
    compile_s = time.perf_counter() - t0
    plan = trainer.plan
    sec = timed(trainer.step, data, args.warmup, args.steps)
    backend.synchronize()
    used, pool_used, pool_held = device_bytes()
    # the executor's own count equals the plan by construction; what the device really holds beyond
    # the plan (CuPy's pool: Find's leftovers, reduction scratch; cuBLAS's and cuDNN's workspaces,
    # the context's growth) shows in cudaMemGetInfo's bytes, measured from before the backend existed
    out = {"seconds": sec, "predicted_seconds": plan.predicted_seconds, "compile_seconds": compile_s,
           "budget_bytes": plan.budget, "plan_peak_bytes": plan.peak_bytes,
           "executor_peak_bytes": trainer.measured_peak_bytes, "device_used_bytes": used - used0,
           "cupy_pool_used_bytes": pool_used, "cupy_pool_held_bytes": pool_held,
           "liveness_peak_bytes": plan.liveness_peak_bytes, "sub_batches": getattr(plan, "k", 1),
           "evictions": len(getattr(plan, "evictions", {}) or {}),
           "algorithm_changes": len(getattr(plan, "algorithm_changes", []) or [])}
    backend.close()
    return out


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


def bench_torch(args, precision, data):
    """PyTorch's step, in this process (main() runs it in a process of its own: its caching allocator
    keeps what it held, which would count in the next configuration's device bytes; and minidnn's
    environment settings stay out of it). bf16/fp16: torch.autocast over the forward and the loss,
    fp16 with GradScaler, as PyTorch's mixed-precision recipe runs them."""
    try:
        import torch
    except ImportError:
        return {"skipped": "torch is not installed"}
    if not torch.cuda.is_available():
        return {"skipped": f"torch {torch.__version__} has no CUDA device"}
    torch.backends.cudnn.benchmark = args.cudnn_benchmark    # PyTorch's default: off
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    net = torch_resnet50(torch).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=low or torch.float32, enabled=low is not None):
            loss = loss_fn(net(torch.from_numpy(x).cuda(non_blocking=False)), torch.from_numpy(y).cuda())
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.item()

    sec = timed(step, data, args.warmup, args.steps)
    return {"seconds": sec, "version": torch.__version__, "max_memory_allocated": torch.cuda.max_memory_allocated(),
            "gpu": torch.cuda.get_device_name(), "side": peers.describe()}


def torch_in_own_process(args, precision, benchmark, seconds_left):
    import subprocess
    cmd = [sys.executable, __file__, "--peer-only", "--peer-precision", precision,
           "--batch-size", str(args.batch_size), "--image-size", str(args.image_size), "--steps", str(args.steps),
           "--warmup", str(args.warmup)] + (["--cudnn-benchmark"] if benchmark else [])
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=peers.environment(),
                           timeout=max(1.0, seconds_left) if seconds_left < 1e9 else None)
    except subprocess.TimeoutExpired:
        return {"skipped": f"PyTorch ran past the {seconds_left:.0f} s left"}
    lines = r.stdout.strip().splitlines()
    if r.returncode or not lines:
        return {"error": (r.stderr or r.stdout).strip()[-400:]}
    return json.loads(lines[-1])


PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def precisions(text):
    """``--precisions``' list, each one of PRECISIONS."""
    out = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in out if p not in PRECISIONS]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"unknown precision {', '.join(bad) or text!r}: use {', '.join(PRECISIONS)}")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--budgets", default="none,0.5,0.25", help="comma-separated: none or fractions of the liveness peak")
    p.add_argument("--precisions", default="fp32,tf32", type=precisions,
                   help="comma-separated, in the order run: fp32, tf32 (convolutions), bf16, fp16 (mixed precision "
                        "as torch.autocast; fp16 with loss scaling)")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds: start no configuration after this (the results so far are written)")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--peer-only", action="store_true", help=argparse.SUPPRESS)   # PyTorch's own process
    p.add_argument("--peer-precision", default="fp32", type=precisions, help=argparse.SUPPRESS)
    p.add_argument("--cudnn-benchmark", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.peer_only:
        print(json.dumps(bench_torch(args, args.peer_precision[0], batches(args, 4))))
        return 0
    import minidnn  # noqa: F401  before NumPy: it sets OpenBLAS's thread timeout, read when NumPy loads OpenBLAS
    data = batches(args, 4)
    start = time.perf_counter()
    left = (lambda: args.deadline - (time.perf_counter() - start)) if args.deadline else (lambda: 1e9)
    report = {"model": "resnet50", "batch_size": args.batch_size, "image_size": args.image_size,
              "steps": args.steps, "machine": peers.machine(), "side": peers.describe(), "torch": {}, "minidnn": {}}
    os.makedirs(args.out, exist_ok=True)
    for prec in args.precisions:
        peer = report["torch"][prec] = {}

        def torch_run(label, benchmark):
            peer[label] = torch_in_own_process(args, prec, benchmark, left()) if left() > 0 else {"skipped": "deadline"}
            print("pytorch", prec, label, peer[label], flush=True)
            timed_runs = {k: r for k, r in peer.items() if isinstance(r, dict) and "seconds" in r}
            if timed_runs:                  # the ratios are against the faster
                peer["seconds"] = min(r["seconds"] for r in timed_runs.values())
                peer["faster"] = min(timed_runs, key=lambda k: timed_runs[k]["seconds"])

        torch_run("defaults", False)     # before minidnn's configurations, and its best setting after them
        for b in args.budgets.split(","):
            key = f"{prec} {b}"
            if left() <= 0:
                report["minidnn"][key] = {"error": "not run: the deadline passed"}
                continue
            budget = None if b == "none" else float(b)
            try:
                report["minidnn"][key] = bench_minidnn(args, budget, prec, data)
            except Exception as e:   # one configuration failing must not lose the others' numbers
                report["minidnn"][key] = {"error": f"{type(e).__name__}: {e}"}
            print("minidnn", key, report["minidnn"][key], flush=True)
            write(args.out, report)      # after each configuration: a timeout keeps what was measured
        torch_run("cudnn.benchmark", True)
        write(args.out, report)
    print("\n".join(write(args.out, report)))
    return 0


def write(out, report) -> list:
    lines = [f"ResNet-50, batch {report['batch_size']}, {report['image_size']}x{report['image_size']}, "
             f"median of {report['steps']} steps; {report['machine']}; each side ran with:",
             peers.side_text("minidnn", report["side"])]
    shown = set()
    for prec, runs in report["torch"].items():
        for label, r in runs.items():
            if isinstance(r, dict) and r.get("side") and "torch" not in shown:
                shown.add("torch")
                lines.append(peers.side_text(f"PyTorch (GPU {r.get('gpu')})", r["side"]))
    gib = 2**30
    for key, r in report["minidnn"].items():
        prec, b = key.split(" ")
        t = report["torch"].get(prec, {}).get("seconds")
        free = report["minidnn"].get(f"{prec} none", {}).get("seconds")
        if "seconds" not in r:
            lines.append(f"  minidnn {prec} budget {b}: {r.get('error')}")
            continue
        rel = [f"{r['seconds'] / t:.2f}x pytorch {t * 1e3:.1f} ms" if t else None,
               f"{r['seconds'] / free - 1:+.1%} vs unlimited" if free and b != "none" else None]
        lines.append(f"  minidnn {prec} budget {b}: measured {r['seconds'] * 1e3:.1f} ms/step, predicted "
                     f"{r['predicted_seconds'] * 1e3:.1f} ms ({', '.join(x for x in rel if x)}); plan peak "
                     f"{r['plan_peak_bytes'] / gib:.2f} GiB, device used {r['device_used_bytes'] / gib:.2f} GiB "
                     f"(cudaMemGetInfo), CuPy pool {r['cupy_pool_held_bytes'] / gib:.2f} GiB held; "
                     f"sub-batches {r['sub_batches']}")
    for prec, runs in report["torch"].items():
        for label, r in runs.items():
            if not isinstance(r, dict):
                continue
            if "seconds" not in r:
                lines.append(f"  pytorch {prec} {label}: {r.get('skipped') or r.get('error')}")
            else:
                lines.append(f"  pytorch {prec} {label}: {r['seconds'] * 1e3:.1f} ms/step"
                             + (" (the faster)" if runs.get("faster") == label else ""))
    with open(os.path.join(out, "cuda_bench.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(out, "cuda_bench.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return lines


if __name__ == "__main__":
    sys.exit(main())
