"""Data-parallel training: (a) measured step times and exposed communication, (b) predicted scaling.

    python scripts/bench_distributed.py measure [--ranks 1 2] [--batch 64] [--steps 5]
    python scripts/bench_distributed.py predict [--models resnet50,resnet152,vgg16]
        [--systems v100-pcie3,a100-nvlink] [--ranks 1,2,4,8] [--batch 64] [--precision fp32] [--json] [--anchor]

    python scripts/bench_distributed.py measure [--ranks 1 2] [--batch 64] [--steps 5]

``measure`` runs ResNet-20 (CIFAR, 3x32x32, synthetic data) at one global
mini-batch on 1 and on 2 ranks (``mpiexec -n N``, one thread each:
OMP_NUM_THREADS=1) and reports per rank count the median step time, the time
the gradient buckets' all-reduces took on the communication thread (waiting for
the other rank included), the exposed communication (the time the compute
waited for a bucket's reduction), the tail (from the end of the backward to the
end of the last reduction) and the time synchronized BatchNorm waited for its
statistics and sums (from each step's trace). On a machine with as many cores as ranks no speed-up is expected from
2 ranks (the cores are the same); the figure is how much of the reduction the
backward hides. Writes ``distributed_measured.json`` to ``--out``.

Part (b), ``predict``: each network at ``--batch`` images per GPU (224x224)
is planned once per system's device, with unlimited memory and at 50% of its
liveness peak (the planner evicting), and its gradient buckets are reduced on
the communication stream of 1/2/4/8 ranks over the system's interconnect
(memory.dataparallel). Speed-up is N * t1 / tN (weak scaling: the global
batch is N x the per-GPU batch), efficiency the speed-up over N; exposed is
the time an update waits for its bucket's reduction. Published anchors:
moDNN 1.84x on 2 GPUs and 3.7x on 4; Horovod 90% efficiency on ResNet-101
and Inception V3, 68% on VGG-16 (512 GPUs, 25 Gb/s RoCE). Targets checked
at the end: ResNet-50 at 50% of its peak reaches 1.9x on 2, 3.8x on 4 and 90%
efficiency on 8 GPUs of every system. ``--anchor`` also predicts ResNet-101
and VGG-16 on 512 GPUs of the profile of Horovod's cluster, beside its figures.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import minidnn as mdn  # first: it sets the thread policies NumPy's BLAS reads when it loads
import numpy as np
from minidnn import models  # noqa: E402
from minidnn.distributed.buckets import gradient_buckets  # noqa: E402
from minidnn.memory import MemoryConfig, plan_memory  # noqa: E402
from minidnn.memory.dataparallel import predict  # noqa: E402
from minidnn.memory.profiles import PRECISIONS, SYSTEMS  # noqa: E402
from minidnn.report import shapes_only, training_schedule  # noqa: E402


BUDGETS = {"unlimited": None, "50%": 0.5}
TARGETS = {2: 1.9, 4: 3.8, 8: 8 * 0.9}   # ResNet-50 speed-ups asked for at 50% of the liveness peak
HOROVOD = {"resnet101": 0.90, "vgg16": 0.68}   # measured efficiency on 512 GPUs (Sergeev & Del Balso 2018)


def predicted(name, batch, systems, ranks, precision="fp32"):
    """Rows (dict) of one network: per system and budget, the prediction at each rank count, the step
    traced and timed in ``precision`` (mixed precision reduces its fp32 master gradients, as DDP
    under autocast does)."""
    with shapes_only():
        net = models.get(name)
    _, schedule = training_schedule(net, (batch, 3, 224, 224), precision)
    buckets = [b.grads for b in gradient_buckets(schedule)]
    rows = []
    for sysname in systems:
        system = SYSTEMS[sysname].at_precision(precision)
        for label, budget in BUDGETS.items():
            plan = plan_memory(schedule, MemoryConfig(budget=budget, profile=system.device))
            row = {"model": name, "batch_per_gpu": batch, "system": sysname, "budget": label,
                   "peak_bytes": plan.peak_bytes, "buckets": len(buckets),
                   "one_gpu_ms": plan.simulation.seconds * 1e3, "ranks": {}}
            for n in ranks:
                p = predict(plan, buckets, system, n)
                assert p.peak_bytes <= (plan.budget or p.peak_bytes)
                row["ranks"][n] = {"step_ms": p.seconds * 1e3, "speedup": p.speedup, "efficiency": p.efficiency,
                                   "comm_ms": p.simulation.comm_seconds * 1e3, "exposed_ms": p.exposed_seconds * 1e3}
            rows.append(row)
    return rows


def cell(c) -> str:
    return f"{c['speedup']:.2f}x ({c['efficiency'] * 100:.1f}%, {c['exposed_ms']:.1f})"


def table(rows, ranks) -> str:
    head = f"{'model':<10}{'system':<13}{'memory':<11}{'1 GPU ms':>9}" + "".join(
        f"{f'{n} GPUs: x (eff, exposed ms)':>30}" for n in ranks if n > 1)
    lines = [head]
    for r in rows:
        cells = "".join(f"{cell(c):>30}" for n, c in r["ranks"].items() if n > 1)
        lines.append(f"{r['model']:<10}{r['system']:<13}{r['budget']:<11}{r['one_gpu_ms']:>9.1f}{cells}")
    return "\n".join(lines)


def targets(rows) -> list:
    """(system, ranks, predicted speed-up, target, met) for ResNet-50 at 50% of its peak."""
    out = []
    for r in rows:
        if r["model"] == "resnet50" and r["budget"] == "50%":
            out += [(r["system"], n, r["ranks"][n]["speedup"], t, r["ranks"][n]["speedup"] >= t)
                    for n, t in TARGETS.items() if n in r["ranks"]]
    return out


def horovod_anchor(batch) -> list:
    """(model, predicted efficiency, Horovod's measured) on the profile of Horovod's 512-GPU cluster."""
    out = []
    for name, measured in HOROVOD.items():
        row = predicted(name, batch, ["p100-128x4-25g"], [512])
        out += [(name, r["ranks"][512]["efficiency"], measured) for r in row if r["budget"] == "unlimited"]
    return out


def run_predict(args) -> int:
    ranks = [int(n) for n in args.ranks.split(",")]
    systems = args.systems.split(",")
    rows = [row for name in args.models.split(",")
            for row in predicted(name, args.batch, systems, ranks, args.precision)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"(b) predicted, {args.batch} images per GPU at 224x224, {args.precision}; speed-up N t1 / tN "
          "(weak scaling)")
    print(table(rows, ranks))
    print("anchors: moDNN 1.84x on 2 GPUs, 3.7x on 4; Horovod 90% (ResNet-101, Inception V3), 68% (VGG-16)")
    if args.anchor:
        for name, got, measured in horovod_anchor(args.batch):
            print(f"anchor {name} on 512 GPUs of p100-128x4-25g: predicted {got * 100:.1f}% efficiency, "
                  f"Horovod measured {measured * 100:.0f}%")
    checked = targets(rows)
    for system, n, got, want, met in checked:
        print(f"target resnet50 @ 50% on {n} GPUs of {system}: {got:.2f}x >= {want:.2f}x  "
              f"{'met' if met else 'MISSED'}")
    return 0 if all(c[-1] for c in checked) else 1


def worker(args):
    """One rank of the measurement (run by ``measure`` under mpiexec)."""
    from minidnn import nn, optim
    from minidnn.distributed import launched, shard_range
    from minidnn.models import resnet20
    from minidnn.trace import REDUCTION_WAIT
    parallel = launched(bn=args.bn)
    rank, size = (parallel.rank, parallel.size) if parallel is not None else (0, 1)
    net = resnet20(num_classes=10)
    net.init_parameters(0)
    trainer = mdn.compile(net, (args.batch, 3, 32, 32), nn.CrossEntropyLoss(),
                          optim.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4), parallel=parallel)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, 3, 32, 32), dtype=np.float32)
    y = rng.integers(0, 10, size=args.batch)
    lo, hi = shard_range(args.batch, rank, size)
    times, comm, exposed, bn, tail = [], [], [], [], []
    for t in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        trainer.step(x[lo:hi], y[lo:hi])
        dt = time.perf_counter() - t0
        if t >= args.warmup:
            spans = trainer.trace.spans
            times.append(dt)
            comm.append(sum(s.end - s.start for s in spans if s.name.startswith("all-reduce bucket")))
            exposed.append(sum(s.end - s.start for s in spans if s.name.startswith(f"{REDUCTION_WAIT} of bucket")))
            bn.append(sum(s.end - s.start for s in spans if s.name.startswith(f"{REDUCTION_WAIT}: BatchNorm")))
            buckets_end = [s.end for s in spans if s.name.startswith("all-reduce bucket")]
            backward_end = max((s.end for s in spans if s.kind == "backward"), default=0.0)
            tail.append(max(0.0, max(buckets_end, default=backward_end) - backward_end))
    if parallel is not None:
        buckets = len(trainer.parallel.reducer.buckets)
        trainer.parallel.close()
    else:
        buckets = 0
    if rank == 0:
        print(json.dumps({"ranks": size, "global_batch": args.batch, "step_seconds": float(np.median(times)),
                          "allreduce_seconds": float(np.median(comm)), "exposed_seconds": float(np.median(exposed)),
                          "batchnorm_wait_seconds": float(np.median(bn)), "tail_seconds": float(np.median(tail)),
                          "buckets": buckets, "steps": args.steps}))


def measure(args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    rows = []
    for n in args.ranks:
        cmd = ([mpiexec, "-n", str(n)] if n > 1 else []) + [
            sys.executable, os.path.abspath(__file__), "worker", "--batch", str(args.batch),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--bn", args.bn]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
        if r.returncode != 0:
            sys.exit(f"bench_distributed: {n} ranks failed:\n{r.stderr[-2000:]}")
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
    base = rows[0]["step_seconds"]
    print(f"ResNet-20 CIFAR, global batch {args.batch}, one thread per rank, BatchNorm {args.bn}, "
          f"median of {args.steps} steps")
    print(f"{'ranks':>5} {'step':>10} {'vs 1':>6} {'all-reduce':>11} {'exposed':>9} {'hidden':>7} {'buckets':>7} "
          f"{'tail':>8} {'BN waits':>9}")
    for r in rows:
        hidden = 1 - r["exposed_seconds"] / r["allreduce_seconds"] if r["allreduce_seconds"] else float("nan")
        r["hidden_share"] = hidden
        print(f"{r['ranks']:>5} {r['step_seconds'] * 1e3:>8.1f}ms {base / r['step_seconds']:>5.2f}x "
              f"{r['allreduce_seconds'] * 1e3:>9.1f}ms {r['exposed_seconds'] * 1e3:>7.1f}ms "
              f"{hidden * 100 if r['allreduce_seconds'] else 0:>6.1f}% {r['buckets']:>7} "
              f"{r['tail_seconds'] * 1e3:>6.1f}ms {r['batchnorm_wait_seconds'] * 1e3:>7.1f}ms")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "distributed_measured.json"), "w") as f:
        json.dump({"bn": args.bn, "rows": rows}, f, indent=1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="(a) measured here: step time and exposed communication on 1 and 2 ranks")
    m.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    m.add_argument("--batch", type=int, default=64, help="the global mini-batch")
    m.add_argument("--steps", type=int, default=5)
    m.add_argument("--warmup", type=int, default=2)
    m.add_argument("--timeout", type=float, default=900)
    m.add_argument("--bn", choices=["sync", "local"], default="sync", help="BatchNorm's statistics")
    m.add_argument("--out", default="bench_out")
    m.set_defaults(fn=measure)
    w = sub.add_parser("worker", help=argparse.SUPPRESS)
    w.add_argument("--batch", type=int, default=64)
    w.add_argument("--steps", type=int, default=5)
    w.add_argument("--warmup", type=int, default=2)
    w.add_argument("--bn", default="sync")
    w.set_defaults(fn=worker)
    r = sub.add_parser("predict", help="(b) predicted scaling on multi-GPU profiles (planning only)")
    r.add_argument("--models", default="resnet50,resnet152,vgg16")
    r.add_argument("--systems", default="v100-pcie3,a100-nvlink", help=f"of {', '.join(SYSTEMS)}")
    r.add_argument("--ranks", default="1,2,4,8")
    r.add_argument("--batch", type=int, default=64, help="images per GPU")
    r.add_argument("--precision", default="fp32", choices=list(PRECISIONS),
                   help="the step's precision (bf16/fp16: mixed precision; the gradients reduced in fp32)")
    r.add_argument("--json", action="store_true")
    r.add_argument("--anchor", action="store_true",
                   help="also ResNet-101 and VGG-16 on 512 GPUs of Horovod's cluster profile (p100-128x4-25g)")
    r.set_defaults(fn=run_predict)
    args = p.parse_args(argv)
    return args.fn(args) or 0


if __name__ == "__main__":
    sys.exit(main())
