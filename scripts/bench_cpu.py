"""Training-step time of minidnn vs PyTorch on the CPU, each as its users run it.

    python scripts/bench_cpu.py [--steps 9] [--batch-size 32] [--threads N] [--peer-env SETTINGS]
                                [--measured] [--without-implicit] [--without-winograd] [--precision bf16]

For ResNet-18 (CIFAR variant) and VGG-11 at 3x32x32, both frameworks train the same network
(minidnn's weights copied into PyTorch's) on the same batch with SGD+momentum. minidnn runs in
this process, imported first as its users do; PyTorch runs in a process of its own
(scripts/peers.py) with the environment less what ``import minidnn`` sets, so at its own
defaults, and again with each ``--peer-env`` (default ``OMP_WAIT_POLICY=PASSIVE``, its likely
best). The steps are taken in turns, one step of each side a round, so that the machine's
noise falls on all; the median of ``--steps`` steps after two warm-up rounds is reported, with
the ratio minidnn / PyTorch at its defaults (and the median of each round's own ratio) and
against PyTorch's faster setting (< 1: minidnn is faster). A round during which other
processes took more than ``--busy`` of the CPU is run again (up to 3 x ``--steps`` rounds;
where too few were quiet, every round is kept), and the output says how many were. Every
side takes its default thread count (``--threads`` sets ``OMP_NUM_THREADS`` for all); the
output names the machine and what each side ran with.

minidnn plans with its default cost model (the CPU profile's speed hints choose each
convolution's algorithm); ``--measured`` also times a trainer whose algorithms are chosen by
timing each one on this machine (``MemoryConfig(profile="measured")``, cached on disk), and
``--without-implicit`` (``--without-winograd``) one without the implicit (Winograd)
convolutions, in the same turns.

``--precision bf16`` times minidnn's mixed-precision step (``compile(precision="bf16")``) against
PyTorch's step under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (the ratios compare these), with
minidnn's fp32 step beside them in the same turns (``fp32``, its ratio against PyTorch's faster bf16).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

STARTED_WITH = dict(os.environ)   # before minidnn adds its settings: shown beside what it ran with
import minidnn  # noqa: E402  before NumPy: it sets OpenBLAS's thread timeout, read when NumPy loads OpenBLAS
import numpy as np  # noqa: E402

import peers  # noqa: E402
from minidnn import models, nn, optim  # noqa: E402
from minidnn.backend.cpu import CPUBackend  # noqa: E402
from synthetic import synthetic_batch  # noqa: E402

NETS = (("ResNet-18 (CIFAR)", "resnet18_cifar", {}), ("VGG-11", "vgg11", {"image_size": 32}))


def bench(name, model, kwargs, args, variants, peer_envs, show):
    """``variants``: (label, device, memory, precision) of the minidnn trainers timed beside the default one;
    ``peer_envs``: PyTorch's settings, {} (its defaults) first. Prints one line; returns the times."""
    shape, x, y = synthetic_batch(model, args.batch_size, image_size=kwargs.get("image_size"))
    trainers, nets = [], []
    for _, device, memory, precision in [("", "cpu", None, args.precision)] + variants:
        nets.append(models.get(model, num_classes=10, **kwargs).init_parameters(0))
        trainers.append(minidnn.compile(nets[-1], shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.01, momentum=0.9),
                                        device=device, memory=memory, precision=precision))
    workers = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            share = os.path.join(tmp, "shared.npz")
            np.savez(share, x=x, y=y, **{"state." + k: np.array(v) for k, v in nets[0].state_dict().items()})
            for env in peer_envs:
                workers.append(peers.Worker(f"PyTorch ({peers.label(env)})",
                                            ["step", "--model", model, "--share", share,
                                             "--precision", args.precision], env))
        if show:
            print(peers.side_text("minidnn", peers.describe(), STARTED_WITH, "import minidnn"))
            for w in workers:
                print(peers.side_text(w.name, w.info, w.env))
            print(flush=True)
        sides = [lambda t=t: timed(lambda: t.step(x, y)) for t in trainers] + [w.step for w in workers]
        times, timed_rounds, busy_rounds, worst = peers.alternate(
            sides, args.steps, warmup=2, gap=args.gap, busy=args.busy, pids=[os.getpid()] + [w.proc.pid for w in workers])
    finally:
        for w in workers:
            w.close()
    med = [peers.quartiles(ts)[0] for ts in times]
    t_mdn, t_torch = med[:len(trainers)], med[len(trainers):]
    best = min(t_torch)
    # beside the ratio of the medians, the median of each round's own ratio: a burst of load
    # that covers a round weighs on both of its steps
    rounds = statistics.median(a / b for a, b in zip(times[0], times[len(trainers)]))
    tag = "" if args.precision == "fp32" else f" {args.precision}"
    line = (f"{name:<18} batch {args.batch_size:>3}  minidnn{tag} {ms(times[0])}  PyTorch{tag} "
            f"{ms(times[len(trainers)])}  "
            f"ratio {t_mdn[0] / t_torch[0]:4.2f} (round by round {rounds:4.2f})")
    for env, ts in zip(peer_envs[1:], times[len(trainers) + 1:]):
        line += f"  | PyTorch {peers.label(env)} {ms(ts)}"
    if len(peer_envs) > 1:
        line += f"  | ratio vs the faster {t_mdn[0] / best:4.2f}"
    for (label, _, _, _), t, ts in zip(variants, t_mdn[1:], times[1:]):
        line += f"  | {label} {ms(ts)} ratio {t / best:4.2f}"
    print(line, flush=True)
    if args.busy is not None:
        kept = len(times[0])
        print(f"{'':<18} {kept} rounds kept of {timed_rounds} timed; in {busy_rounds} other processes took more "
              f"than {args.busy:.0%} of the CPU during a step" + ("" if busy_rounds == timed_rounds - kept else
              " (too few quiet rounds: all kept, the figures are a busy machine's)")
              + f"; at most {worst:.0%} in a round kept", flush=True)
    return times


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def ms(ts):
    """'701.2 ms (690-720)': the median and the quartiles of ``ts`` seconds, in ms."""
    m, lo, hi = peers.quartiles(ts)
    return f"{m * 1e3:7.1f} ms ({lo * 1e3:.0f}-{hi * 1e3:.0f})"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=9, help="timed steps of each side (default 9)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None,
                    help="OMP_NUM_THREADS for every side (default: unset, each side's own default)")
    ap.add_argument("--peer-env", action="append", metavar="NAME=VALUE[,...]",
                    help="also time PyTorch with these settings (repeatable; default OMP_WAIT_POLICY=PASSIVE; "
                         "'' for its defaults only)")
    ap.add_argument("--busy", type=float, default=0.10,
                    help="run a round again where other processes took more than this share of the CPU "
                         "during one of its steps (default 0.10; a negative value keeps every round)")
    ap.add_argument("--gap", type=float, default=0.2, help="seconds of pause before each side's turn")
    ap.add_argument("--nets", default=",".join(m for _, m, _ in NETS), help="comma-separated subset of "
                    + ", ".join(m for _, m, _ in NETS))
    ap.add_argument("--without-implicit", action="store_true",
                    help="also time minidnn without its implicit convolution algorithm, in the same turns")
    ap.add_argument("--without-winograd", action="store_true",
                    help="also time minidnn without its Winograd convolution algorithms, in the same turns")
    ap.add_argument("--measured", action="store_true",
                    help="also time minidnn with algorithms chosen by measuring them here, in the same turns")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: minidnn's mixed precision vs PyTorch's CPU autocast bf16, minidnn fp32 beside them")
    args = ap.parse_args(argv)
    args.busy = None if args.busy < 0 else args.busy
    if args.threads is not None and os.environ.get("OMP_NUM_THREADS") != str(args.threads):
        # OpenMP and OpenBLAS read it when they load, which has happened in this process: start again
        env = dict(STARTED_WITH, OMP_NUM_THREADS=str(args.threads))
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    p = args.precision
    variants = ([("fp32", "cpu", None, "fp32")] if p != "fp32" else []) + (
        [("measured", "cpu", minidnn.MemoryConfig(profile="measured"), p)] if args.measured else []) + (
        [("without implicit", CPUBackend(implicit=False), None, p)] if args.without_implicit else []) + (
        [("without winograd", CPUBackend(winograd=False), None, p)] if args.without_winograd else [])
    peer_envs = [{}] + [peers.settings(s) for s in (args.peer_env if args.peer_env is not None
                                                     else peers.DEFAULT_BEST) if s]
    print(f"machine: {peers.machine()}; load average {peers.load()} at the start")
    print(f"median (quartiles) of {args.steps} steps of each side after 2 warm-up rounds; every round one step "
          f"of each side, the first side rotating, {args.gap:g} s pause before each; each side ran with:")
    nets = args.nets.split(",")
    for i, (name, model, kwargs) in enumerate(n for n in NETS if n[1] in nets):
        bench(name, model, kwargs, args, variants, peer_envs, show=i == 0)
    print(f"load average {peers.load()} at the end")


if __name__ == "__main__":
    main()
