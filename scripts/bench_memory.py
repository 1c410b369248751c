"""Memory plans of ImageNet networks on GPU profiles: planning only, no kernels run.

    python scripts/bench_memory.py [--profiles titanx-12gb,v100-16gb] [--budgets 12GiB,16GiB] [--deepest]
    python scripts/bench_memory.py --tight-only --tight-profiles a100-sxm4-80gb,h100-sxm5-80gb --precision tf32|bf16

For each network and batch: ideal (no reuse), liveness peak, lower bound, and
at each budget the plan peak and the predicted step time relative to
unlimited memory (the simulator's replay of the plan on compute + copy
streams). Published reference points: vDNN trains VGG-16 at batch 256 (28 GB
ideal) in 12 GB at -18% speed; moDNN reports +3% at 12 GB. A cell also gives
the split the default (``MemoryConfig(sub_batching="fastest")``) takes where the
simulator predicts it faster than evicting, or where only a split fits (k
sub-batches of b; with BatchNorm, staged between BatchNorms with the full
batch's statistics): k x b: peak (overhead against the unsplit step with
unlimited memory). That split is what ``minidnn plan`` prints. The tight table (50% and 25%
of each liveness peak) gives beside each plan the bound under every plan's
step time there (``memory.bound.step_time_floor``: what must leave the device
at the highest steps, by recomputation or by copies the stream has time for).
``--deepest`` also
searches the deepest ResNet (batch 16, 224x224) whose plan fits 12 GiB
(SuperNeurons reports ResNet-2500 on 12 GB). It also times the planner on
ResNet-1001 (batch 16) and prints VGG-16's memory floor at batch 256 (ideal
over the minimum at sub-batches of 1). ``--train`` then runs kernels: VGG-11 at
64x64 trained on the CPU under a budget below its full-batch minimum (the
mini-batch is split), with its loss, split and measured peak per step.
"""
from __future__ import annotations

import argparse
import time

import minidnn  # before NumPy: it sets OpenBLAS's thread timeout, read when NumPy loads OpenBLAS
import numpy as np

from minidnn import MemoryBudgetError, models, nn, optim
from minidnn.memory import MemoryConfig, format_bytes, parse_bytes, plan_memory
from minidnn.memory.bound import step_time_floor
from minidnn.memory.costmodel import CachedCost, ProfileCost
from minidnn.memory.planner import minimum_bytes
from minidnn.memory.profiles import PRECISIONS, get_profile
from minidnn.memory.subbatch import split_step, trains_batch_norm
from minidnn.report import shapes_only, step_splits, training_schedule

# the tight end: 50% and 25% of each network's liveness peak on today's GPUs
TIGHT = [("resnet50", 256), ("resnet152", 256), ("densenet121", 128), ("vgg16", 256)]
TIGHT_PROFILES = "titanx-12gb,v100-16gb,a100-40gb,h100-80gb"
CASES = [("vgg16", 64), ("vgg16", 128), ("vgg16", 256), ("resnet50", 32), ("resnet50", 128), ("resnet50", 256),
         ("resnet101", 64), ("resnet101", 256), ("resnet152", 32), ("resnet152", 256), ("googlenet", 256),
         ("densenet121", 128)]


def gib(n):
    return f"{n / 2**30:.2f}"


def row(name, batch, profiles, budgets, bound=False, precision="fp32"):
    with shapes_only():
        net = models.get(name)
    shape = (batch, 3, 224, 224)
    _, sched = training_schedule(net, shape, precision)
    splits, batch_norm = step_splits(net, shape, precision), trains_batch_norm(sched)
    cells = []
    base = None
    for prof in profiles:
        liveness = None
        for b in budgets:
            if isinstance(b, float):         # a fraction of this profile's liveness peak, in bytes
                if liveness is None:
                    liveness = plan_memory(sched, MemoryConfig(profile=prof)).liveness_peak_bytes
                b = MemoryConfig(budget=b).resolve(liveness)
            config = MemoryConfig(budget=b, profile=prof)
            try:
                plan = plan_memory(sched, config)
            except MemoryBudgetError as e:
                cell = f"min {gib(e.minimum_bytes)}"
                try:                          # below the full batch's minimum: only a split fits
                    sub = split_step(batch, batch_norm, splits, config)
                    unlimited = plan_memory(sched, MemoryConfig(profile=prof)).simulation.seconds
                    cell += (f"; {sub.k}x{sub.sub_batch}: {gib(sub.peak_bytes)} "
                             f"({(sub.predicted_seconds / unlimited - 1) * 100:+.1f}%)")
                except MemoryBudgetError:
                    pass
                cells.append(cell)
                continue
            base = plan
            over = plan.predicted_overhead or 0.0
            least = f", bound {step_time_floor(sched, b, CachedCost(ProfileCost(prof))).overhead * 100:+.1f}%" if bound else ""
            cell = f"{gib(plan.peak_bytes)} ({over * 100:+.1f}%{least})"
            if over > 0:                      # the split the default takes where it is faster
                sub = split_step(batch, batch_norm, splits, config, bar=plan.predicted_seconds)
                if sub is not None:
                    cell += (f"; {sub.k}x{sub.sub_batch}: {gib(sub.peak_bytes)} "
                             f"({(sub.predicted_seconds / plan.baseline.seconds - 1) * 100:+.1f}%)")
            cells.append(cell)
    if base is None:
        base = plan_memory(sched, MemoryConfig(profile=profiles[0]))
    return (f"| {name} | {batch} | {gib(base.ideal_bytes)} | {gib(base.liveness_peak_bytes)} | "
            f"{gib(base.lower_bound_bytes)} | " + " | ".join(cells) + " |")


def floor(name, batch):
    """(ideal, minimum at the full batch, minimum at sub-batches of 1) in bytes: the memory floor."""
    def schedule(b):
        with shapes_only():
            net = models.get(name)
        return training_schedule(net, (b, 3, 224, 224))[1]
    full = schedule(batch)
    ideal = plan_memory(full, MemoryConfig()).ideal_bytes
    return ideal, minimum_bytes(full), minimum_bytes(schedule(1))


def deepest(profile, budget, batch=16):
    """The deepest Bottleneck ResNet (depth 3 * blocks + 2, to within 30 layers) whose plan fits
    ``budget``: doubling, then bisecting the number of blocks."""
    def fits(blocks):
        with shapes_only():
            net = models.get("resnet_deep", depth=3 * blocks + 2)
        _, sched = training_schedule(net, (batch, 3, 224, 224))
        try:
            plan_memory(sched, MemoryConfig(budget=budget, profile=profile))
            return True
        except MemoryBudgetError:
            return False
    lo, hi = 16, 16
    while fits(hi) and hi < 2000:
        lo, hi = hi, hi * 2
    while hi - lo > 10:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return 3 * lo + 2


def train_below_minimum(batch=32, steps=6):
    """VGG-11 at 64x64 on the CPU backend, under a budget below its full-batch minimum: it trains, in budget."""
    def compile_at(budget, **kw):
        net = models.get("vgg11", num_classes=10, image_size=64, dropout=0.0).init_parameters(0)
        return minidnn.compile(net, (batch, 3, 64, 64), nn.CrossEntropyLoss(), optim.SGD(lr=0.01, momentum=0.9),
                               memory=MemoryConfig(budget=budget, **kw))
    least = {}
    for split in (False, True):
        try:
            compile_at(1, sub_batching=split)
        except MemoryBudgetError as e:
            least[split] = e.minimum_bytes
    full_min = least[False]
    budget = (least[False] + least[True]) // 2      # between the minimum at sub-batches of 1 and the full batch's
    t = compile_at(budget)
    print(f"\nvgg11 batch {batch} at 64x64 on the CPU: full-batch minimum {format_bytes(full_min)}, budget "
          f"{format_bytes(budget)} -> {t.plan.k} sub-batches of {batch // t.plan.k}, plan peak "
          f"{format_bytes(t.plan.peak_bytes)}")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((batch, 3, 64, 64)).astype(np.float32), rng.integers(0, 10, batch)
    for s in range(steps):
        t0 = time.perf_counter()
        loss = t.step(x, y)
        print(f"  step {s + 1}: loss {loss:.4f}, measured peak {format_bytes(t.measured_peak_bytes)} "
              f"(<= budget: {t.measured_peak_bytes <= budget}), {time.perf_counter() - t0:.2f} s")


def table(cases, profiles, budgets, heads, bound=False, precision="fp32"):
    """One markdown table: a row per (network, batch) of ``cases``, a cell per profile and budget
    (``bound``: with the floor under every plan's step time there, memory/bound.py), each step traced
    in ``precision`` (bf16/fp16: mixed precision's 2-byte activations)."""
    print("| network | batch | ideal | liveness peak | lower bound | " + " | ".join(heads) + " |")
    print("|---" * (5 + len(heads)) + "|")
    t0 = time.perf_counter()
    for name, batch in cases:
        print(row(name, batch, profiles, budgets, bound, precision), flush=True)
    print(f"\nplanned in {time.perf_counter() - t0:.1f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", default="titanx-12gb,v100-16gb")
    ap.add_argument("--budgets", default="12GiB,16GiB")
    ap.add_argument("--fractions", default="50%,25%", help="the tight table's budgets, of the liveness peak")
    ap.add_argument("--tight-profiles", default=TIGHT_PROFILES)
    ap.add_argument("--precision", default="fp32", choices=list(PRECISIONS),
                    help="the tight table's precision (tf32: convolutions and GEMMs on the profiles' tensor "
                         "cores; bf16/fp16: mixed precision, 2-byte activations, fp32 master weights)")
    ap.add_argument("--tight-only", action="store_true", help="the tight table alone")
    ap.add_argument("--deepest", action="store_true")
    ap.add_argument("--train", action="store_true", help="also train VGG-11 (CPU) below its full-batch minimum")
    args = ap.parse_args()
    profiles = args.profiles.split(",")
    budgets = [parse_bytes(b) for b in args.budgets.split(",")]
    print("GiB; each budget cell: plan peak (predicted step time vs unlimited memory), or the minimum if infeasible")
    if not args.tight_only:
        table(CASES, profiles, budgets, [f"{p} @ {format_bytes(b)}" for p in profiles for b in budgets])
    names = args.tight_profiles.split(",")
    tight = [get_profile(p).at_precision(args.precision) for p in names]
    fractions = [float(f.strip("%")) / 100 for f in args.fractions.split(",")]
    print(f"\nat a fraction of the liveness peak, {args.precision} (targets: at most +3% at 50%, +33% at 25%); "
          "bound: the least any plan can take there (memory/bound.py)")
    table(TIGHT, tight, fractions, [f"{p} @ {f:.0%}" for p in names for f in fractions], bound=True,
          precision=args.precision)
    if args.tight_only:
        return
    with shapes_only():
        net = models.get("resnet_deep", depth=1001)
    _, sched = training_schedule(net, (16, 3, 224, 224))
    t0 = time.perf_counter()
    plan = plan_memory(sched, MemoryConfig(budget=12 * 2**30, profile=profiles[0]))
    print(f"\nresnet-1001 batch 16 at 224x224 ({len(sched.steps)} steps) within 12 GiB on {profiles[0]}: planned in "
          f"{time.perf_counter() - t0:.1f} s; plan peak {gib(plan.peak_bytes)} GiB, "
          f"{plan.predicted_overhead * 100:+.1f}% predicted")
    ideal, full, one = floor("vgg16", 256)
    print(f"\nmemory floor, vgg16 batch 256 at 224x224: ideal {gib(ideal)} GiB; minimum {gib(full)} GiB at the full "
          f"batch ({ideal / full:.1f}x less than ideal), {gib(one)} GiB in sub-batches of 1 "
          f"({ideal / one:.1f}x less; moDNN reports up to 59x)")
    if args.deepest:
        print(f"deepest ResNet at batch 16, 224x224, within 12 GiB on {profiles[0]}: "
              f"~{deepest(profiles[0], 12 * 2**30)} layers")
    if args.train:
        train_below_minimum()


if __name__ == "__main__":
    main()
