"""Planning time of the `minidnn plan` commands of the README and of issue #29 item 9: CPU seconds.

    python scripts/bench_planning_time.py [--repeats 3] [--only resnet18] [--skip-deepest]
                                          [--record plans.json | --compare plans.json]

Each row is one command's plan as `minidnn plan` makes it (the whole step, or the split it
chooses), timed with ``time.process_time()`` (CPU seconds, so that other jobs on the machine
count less), the median of ``--repeats`` runs in one process, the network traced and scheduled
inside the timing. The floor `minidnn plan` prints beside a plan (memory/bound.py) is not
included: it is timed by its own benchmark. ResNet-4010 (batch 16 within 12 GiB on the Titan X
profile) is the deepest network `bench_memory.py --deepest` finds.

``--record`` writes each command's plan (k, its decisions, algorithms, arena bytes and predicted
seconds, the floats as repr) to a JSON file; ``--compare`` checks the plans against such a file and
exits 1 where one differs: what a change meant only to plan faster must leave the same.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import minidnn  # noqa: F401  (before NumPy: it sets OpenBLAS's thread timeout)
from minidnn import models
from minidnn.cli import SUB_BATCHING
from minidnn.memory.config import MemoryConfig, parse_budget
from minidnn.memory.profiles import get_system
from minidnn.memory.subbatch import plan_step, runs
from minidnn.report import make_plan, shapes_only, step_splits, training_schedule

# (model, batch, budget, profile, precision, policy, depth[, sub-batching]): the README's commands,
# then item 9's
COMMANDS = [
    ("resnet50", 256, "25%", "a100-40gb", "fp32", "auto", None),
    ("resnet50", 256, "25%", "a100-sxm4-80gb", "tf32", "auto", None),
    ("resnet50", 256, "6GiB", "v100-16gb", "fp32", "auto", None),
    ("vgg16", 256, "12GiB", "titanx-12gb", "fp32", "auto", None),
    ("vgg16", 256, "12GiB", "titanx-12gb", "fp32", "vdnn_dyn", None),
    ("resnet_deep", 16, "12GiB", "titanx-12gb", "fp32", "auto", None),
    ("resnet18", 512, "30%", "titanx-12gb", "fp32", "auto", None),
    ("googlenet", 256, "25%", "a100-40gb", "fp32", "auto", None),
    ("resnet50", 256, "10%", "a100-40gb", "fp32", "auto", None),
    ("resnet_deep", 16, "12GiB", "titanx-12gb", "fp32", "auto", 4010),
    ("resnet50", 256, "15%", "a100-40gb", "fp32", "auto", None),
]


def plan(name, batch, budget, profile, precision, policy, depth, sub_batching="fastest"):
    """The plan `minidnn plan` makes for this command (without its floor)."""
    device = get_system(profile).at_precision(precision).device
    split = SUB_BATCHING[sub_batching]
    if depth is None:
        return make_plan(name, batch, 224, parse_budget(budget), policy, device, split)[0]
    shape = (batch, 3, 224, 224)
    with shapes_only():
        net = models.get(name, depth=depth)
    _, schedule = training_schedule(net, shape)
    config = MemoryConfig(budget=parse_budget(budget), policy=policy, profile=device, sub_batching=split)
    return plan_step(schedule, config, splits=step_splits(net, shape))


def fingerprint(p) -> dict:
    """What must not change when planning gets faster: the split, and the plan of each of its runs
    (decisions, algorithms, horizon, arena bytes, predicted seconds; floats as repr)."""
    def one(plan):
        return {"evictions": sorted([[list(k), [e.kind, e.delay, e.lead, e.early]] for k, e in plan.evictions.items()]),
                "algos": sorted([[i, a.name, a.workspace] for i, a in plan.algos.items()]),
                "keep_within": plan.keep_within, "arena_bytes": plan.arena_bytes,
                "seconds": repr(float(plan.simulation.seconds))}
    distinct = {id(plan): plan for _, plan in runs(p)}          # a sub-batch plan runs k times
    return {"k": p.k, "predicted_seconds": repr(float(p.predicted_seconds)),
            "runs": [one(plan) for plan in distinct.values()]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default=None, help="the commands of this model only")
    ap.add_argument("--skip-deepest", action="store_true", help="leave ResNet-4010 out")
    ap.add_argument("--record", metavar="JSON", help="write each command's plan to this file")
    ap.add_argument("--compare", metavar="JSON", help="check each command's plan against this file's")
    args = ap.parse_args()
    recorded = json.load(open(args.compare)) if args.compare else {}
    plans, differ = {}, []
    print("| command | plan | CPU seconds (median) |")
    print("|---|---|---|")
    for cmd in COMMANDS:
        name, batch, budget, profile, precision, policy, depth = cmd[:7]
        sub_batching = cmd[7] if len(cmd) > 7 else "fastest"
        if (args.only and name != args.only) or (args.skip_deepest and depth):
            continue
        times = []
        for _ in range(args.repeats):
            t0 = time.process_time()
            p = plan(*cmd)
            times.append(time.process_time() - t0)
        what = (f"minidnn plan --model {name}{f' (depth {depth})' if depth else ''} --batch-size {batch} "
                f"--budget {budget} --profile {profile}"
                + (f" --precision {precision}" if precision != "fp32" else "")
                + (f" --policy {policy}" if policy != "auto" else "")
                + (f" --sub-batching {sub_batching}" if sub_batching != "fastest" else ""))
        split = f"{p.k} x {p.sub_batch}, " if p.k > 1 else ""
        same = ""
        plans[what] = fingerprint(p)
        if args.compare:
            same = " (same plan)" if recorded.get(what) == plans[what] else " (PLAN DIFFERS)"
            if recorded.get(what) != plans[what]:
                differ.append(what)
        print(f"| `{what}` | {split}{p.predicted_overhead * 100:+.1f}%{same} | {statistics.median(times):.2f} |",
              flush=True)
    if args.record:
        with open(args.record, "w") as f:
            json.dump(plans, f, indent=1)
    if differ:
        sys.exit(f"{len(differ)} plan(s) differ from {args.compare}: " + "; ".join(differ))


if __name__ == "__main__":
    main()
