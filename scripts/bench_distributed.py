"""Data-parallel training: measured step times and exposed communication.

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
    args = p.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()
