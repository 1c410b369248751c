"""Planning time of the `minidnn plan` commands of the README and of issue #29 item 9: CPU seconds.

    python scripts/bench_planning_time.py [--repeats 3] [--only resnet18] [--skip-deepest]

Each row is one command's plan as `minidnn plan` makes it (the whole step, or the split it
chooses), timed with ``time.process_time()`` (CPU seconds, so that other jobs on the machine
count less), the median of ``--repeats`` runs in one process, the network traced and scheduled
inside the timing. The floor `minidnn plan` prints beside a plan (memory/bound.py) is not
included: it is timed by its own benchmark. ResNet-4010 (batch 16 within 12 GiB on the Titan X
profile) is the deepest network `bench_memory.py --deepest` finds.
"""
from __future__ import annotations

import argparse
import statistics
import time

import minidnn  # noqa: F401  (before NumPy: it sets OpenBLAS's thread timeout)
from minidnn import models
from minidnn.memory.config import MemoryConfig, parse_budget
from minidnn.memory.profiles import get_system
from minidnn.memory.subbatch import plan_step
from minidnn.report import make_plan, shapes_only, step_splits, training_schedule

# (model, batch, budget, profile, precision, policy, depth): the README's commands, then item 9's
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
]


def plan(name, batch, budget, profile, precision, policy, depth):
    """The plan `minidnn plan` makes for this command (without its floor)."""
    device = get_system(profile).at_precision(precision).device
    if depth is None:
        return make_plan(name, batch, 224, parse_budget(budget), policy, device)[0]
    shape = (batch, 3, 224, 224)
    with shapes_only():
        net = models.get(name, depth=depth)
    _, schedule = training_schedule(net, shape)
    config = MemoryConfig(budget=parse_budget(budget), policy=policy, profile=device)
    return plan_step(schedule, config, splits=step_splits(net, shape))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default=None, help="the commands of this model only")
    ap.add_argument("--skip-deepest", action="store_true", help="leave ResNet-4010 out")
    args = ap.parse_args()
    print("| command | plan | CPU seconds (median) |")
    print("|---|---|---|")
    for cmd in COMMANDS:
        name, batch, budget, profile, precision, policy, depth = cmd
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
                + (f" --policy {policy}" if policy != "auto" else ""))
        split = f"{p.k} x {p.sub_batch}, " if p.k > 1 else ""
        print(f"| `{what}` | {split}{p.predicted_overhead * 100:+.1f}% | {statistics.median(times):.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
