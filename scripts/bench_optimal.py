"""The heuristic planner beside the exact reference (memory/optimal.py), planning only (one table).

    python scripts/bench_optimal.py [--profile v100-16gb] [--time-limit 5] [--fractions 0.8,0.6,0.4]
                                    [--nets lenet5,resnet20,densenet_small,vgg11,dag0,dag1]

For each network and budget, ``plan_memory``'s plan (the heuristic) and the MILP's (warm-started
from it where the model admits it), both lowered, placed and simulated by the planner's code:

- **budget**: a fraction f of the liveness peak's arena above the persistent bytes (persistent +
  f x arena: VGG-11's 28M parameters at 32x32 are most of its liveness peak), or the planner's
  own minimum (``minimum_bytes``);
- **steps**: schedule steps (the MILP has one stage per step);
- **heuristic**: its simulated step time (relative to unlimited memory) and plan peak;
- **MILP**: its objective (the model's seconds of the incumbent), the solver's status, MIP gap and
  solve time (the last round's; ``+R`` where it modelled the placement's two regions, ``warm``
  where it started from the heuristic's plan, and the rounds where placement needed more than the
  model: optimal.solve_reference), and the MILP plan's simulated time (``-`` where no MILP plan
  placed within the budget);
- **heur vs opt**: the heuristic's simulated time over the reference's (the faster of the two),
  minus one; and over the solver's bound (a lower bound on the model's time) in brackets.

Times are in microseconds on the device profile's cost model (``--profile``). Batch sizes are small
so that the step count stays tractable; each solve stops at ``--time-limit`` seconds.

``--agreement`` prints instead how far the model is from the lowering: for random decisions
(each gap dropped with probability 0.15 where it can be, else offloaded with 0.1 at a random
timing of OFFLOAD_TIMINGS; random algorithms), the model's peak and per-stage memory less the
lowered program's, and its time over the simulator's.
"""
from __future__ import annotations

import argparse
import time

import minidnn  # noqa: F401  (before NumPy: it sets OpenBLAS's thread timeout)
import numpy as np

from minidnn import models, nn, optim
from minidnn.autograd import build_schedule
from minidnn.errors import MemoryBudgetError
from minidnn.graph import trace
from minidnn.memory import MemoryConfig, minimum_bytes, plan_memory
from minidnn.memory.costmodel import CachedCost, ProfileCost
from minidnn.memory.optimal import solve_reference
from minidnn.memory.optimal_model import OFFLOAD_TIMINGS, RECOMPUTE, Model
from minidnn.memory.planner import algorithm_options
from minidnn.memory.program import Evict, lower
from minidnn.memory.simulator import memory_curve, simulate
from minidnn.models.random_dag import SHAPE, RandomDag, random_spec

NETS = {
    "lenet5": ("LeNet-5 b8", lambda: models.lenet5(), (8, 1, 28, 28)),
    "resnet20": ("ResNet-20 b4", lambda: models.resnet20(), (4, 3, 32, 32)),
    "densenet_small": ("DenseNet-small b4", lambda: models.densenet_small(), (4, 3, 32, 32)),
    "vgg11": ("VGG-11 32x32 b4", lambda: models.vgg11(num_classes=10, image_size=32), (4, 3, 32, 32)),
    "dag0": ("random DAG 16 (seed 0)", lambda: RandomDag(random_spec(np.random.default_rng(0), 16)), SHAPE),
    "dag1": ("random DAG 24 (seed 1)", lambda: RandomDag(random_spec(np.random.default_rng(1), 24)), SHAPE),
}


def schedule_of(build, shape):
    graph = trace(build(), shape, loss=nn.CrossEntropyLoss())
    return build_schedule(graph, optimizer=optim.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4))


def rows_for(key, profile, fractions, time_limit):
    label, build, shape = NETS[key]
    sched = schedule_of(build, shape)
    cost = CachedCost(ProfileCost(profile))
    config = MemoryConfig(profile=profile)
    unlimited = plan_memory(sched, config, cost)
    base = unlimited.simulation.seconds
    persistent = sched.persistent_bytes
    budgets = [(f"{f:.0%}", int(persistent + f * (unlimited.peak_bytes - persistent))) for f in fractions]
    budgets.append(("min", minimum_bytes(sched, config, cost)))
    out = []
    for name, budget in budgets:
        row = {"net": label, "steps": len(sched.steps), "budget": name, "bytes": budget}
        try:
            heuristic = plan_memory(sched, MemoryConfig(budget=budget, profile=profile), cost)
        except MemoryBudgetError:
            heuristic = None
        began = time.perf_counter()
        try:
            ref = solve_reference(sched, budget, cost, config, time_limit, heuristic=heuristic)
        except MemoryBudgetError as e:
            row["error"] = str(e).split(":")[0]
            out.append(row)
            continue
        sol = ref.solution
        row.update(wall=time.perf_counter() - began, base=base, sol=sol, rounds=ref.rounds,
                   heur=ref.heuristic, milp=ref.milp, best=ref.plan)
        out.append(row)
    return out


def us(seconds):
    return f"{seconds * 1e6:.1f}"


def rel(seconds, base):
    return f"{us(seconds)} ({seconds / base - 1:+.1%})"


def kib(n):
    return f"{n / 1024:.0f}"


def print_table(rows):
    head = ("| network | steps | budget (KiB) | heuristic us (vs unlimited) | heuristic peak KiB | MILP objective us "
            "| status | MIP gap | solve s | MILP simulated us | heur vs opt [vs bound] |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        cells = [r["net"], str(r["steps"]), f"{r['budget']} ({kib(r['bytes'])})"]
        if "error" in r:
            print("| " + " | ".join(cells + [r["error"]] + [""] * 7) + " |")
            continue
        h, m, sol, base = r["heur"], r["milp"], r["sol"], r["base"]
        status = {"Optimal": "optimal", "Time limit reached": "time limit", "Infeasible": "infeasible"}.get(
            sol.status, sol.status) + (" +R" if sol.regions else "") + (", warm" if sol.warm else "") + (
            "" if r["rounds"] == 1 else f" ({r['rounds']} rounds)")
        cells += [rel(h.simulation.seconds, base) if h else "-", kib(h.peak_bytes) if h else "-",
                  us(sol.objective) if sol.objective is not None else "-", status,
                  f"{sol.gap:.1%}" if np.isfinite(sol.gap) else "-", f"{sol.seconds:.1f}",
                  rel(m.simulation.seconds, base) if m else "-"]
        if h:
            gap = h.simulation.seconds / r["best"].simulation.seconds - 1
            bound = f" [{h.simulation.seconds / sol.bound - 1:+.1%}]" if np.isfinite(sol.bound) and sol.bound > 0 else ""
            cells.append(f"{gap:+.1%}{bound}")
        else:
            cells.append("heuristic: none")
        print("| " + " | ".join(cells) + " |")


def stages(program):
    """The schedule step each program step belongs to: a copy or a recomputation that of the
    compute step it precedes (an offload: follows), a compute step its own."""
    out, pending, last = [], 0, 0
    for s, origin in zip(program.steps, program.origin):
        if s.kind == "offload":
            out.append(last)
        elif s.kind in ("prefetch", "recompute"):
            out.append(None)
            pending += 1
        else:
            last = origin
            out[len(out) - pending:] = [origin] * pending
            out.append(origin)
            pending = 0
    return np.array([last if o is None else o for o in out])


def agreement(profile, keys, trials=60):
    rng = np.random.default_rng(0)
    print("| network | steps | decisions | peak: model - lowered (B) | per stage (B) | time: model / simulated - 1 |")
    print("|---|---|---|---|---|---|")
    for key in keys:
        label, build, shape = NETS[key]
        sched = schedule_of(build, shape)
        cost = CachedCost(ProfileCost(profile))
        options = algorithm_options(sched, cost)
        model = Model(sched, cost, options=options)
        peaks, stage, times = [], [], []
        for _ in range(trials):
            ev = {}
            for key_ in set(model.d) | set(model.o):
                r = rng.random()
                if key_ in model.d and r < 0.15:
                    ev[key_] = RECOMPUTE
                elif key_ in model.o and r > 0.9:
                    ev[key_] = Evict("offload", *OFFLOAD_TIMINGS[rng.integers(len(OFFLOAD_TIMINGS))])
            algos = {s: opts[int(rng.integers(len(opts)))][1] for s, opts in options.items()}
            seen = model.evaluate(ev, algos)
            if seen is None:
                continue
            ev = model.decisions(seen.x)[0]     # the timings the model took
            program = lower(sched, ev, model.touch, algos)
            curve = memory_curve(program)
            per = np.zeros(len(sched.steps), np.int64)
            np.maximum.at(per, stages(program), curve)
            modelled = np.array([max(total.value(seen.x) for _, total in model._points(s)) for s in range(model.n)])
            peaks.append(seen.peak - int(curve.max()))
            stage.append((modelled - per).min())
            stage.append((modelled - per).max())
            times.append(seen.seconds / simulate(program, sched, cost, algos=algos).seconds - 1)
        print(f"| {label} | {len(sched.steps)} | {len(peaks)} | {min(peaks)} to {max(peaks)} | "
              f"{min(stage):.0f} to {max(stage):.0f} | {min(times):+.1%} to {max(times):+.1%} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="v100-16gb")
    ap.add_argument("--time-limit", type=float, default=5.0, help="seconds per MILP solve")
    ap.add_argument("--fractions", default="0.8,0.6,0.4")
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--agreement", action="store_true", help="the model against the lowering instead")
    args = ap.parse_args()
    if args.agreement:
        agreement(args.profile, args.nets.split(",") if args.nets != ",".join(NETS) else ["dag0", "dag1", "resnet20"])
        return
    fractions = [float(f) for f in args.fractions.split(",")]
    began = time.perf_counter()
    rows = []
    for key in args.nets.split(","):
        rows += rows_for(key, args.profile, fractions, args.time_limit)
    print(f"profile {args.profile}, time limit {args.time_limit:g} s per solve\n")
    print_table(rows)
    print(f"\n{time.perf_counter() - began:.0f} s in all")


if __name__ == "__main__":
    main()
