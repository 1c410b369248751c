"""The heuristic planner beside the exact reference (memory/optimal.py) and the floor (memory/bound.py),
planning only (one table).

    python scripts/bench_optimal.py [--profile v100-16gb] [--time-limit 60] [--fractions 0.8,0.6,0.4]
                                    [--nets lenet5,resnet20,densenet_small,vgg11,dag0,dag1]
                                    [--timings paired|independent]

For each network and budget, ``plan_memory``'s plan (the heuristic) and the reference's, each
lowered, placed and simulated by the planner's code:

- **budget**: a fraction f of the liveness peak's arena above the persistent bytes (persistent +
  f x arena: VGG-11's 28M parameters at 32x32 are most of its liveness peak), or the planner's
  own minimum (``minimum_bytes``);
- **optimum**: the reference's plan's simulated time where it proved it the fastest plan of its
  decision space that places within the budget ("optimal"); where its time limit stopped it, the
  fastest plan it found, its proven lower bound and the gap between them; "none places" where it
  proved that no plan of the space places;
- **heuristic**: its simulated time and its distance from the optimum (from the proven bound,
  as "at most", where the optimum is not proven); "-" where it has no plan;
- **floor**: ``step_time_floor``, a lower bound on every plan within the budget, and its distance
  below the optimum;
- **search**: the reference's candidates (those that placed over the budget) and its seconds.

Times are in microseconds on the device profile's cost model (``--profile``), relative to the
unlimited step in brackets. Where the heuristic is over 5% from the optimum, the decisions where
the two plans differ follow the table.

``--agreement`` prints instead how far the model is from the lowering and the simulator: for random
decisions (each gap dropped with probability 0.15 where it can be, else offloaded with 0.1 at a
random timing the model offers; random algorithms), the model's time over the simulator's (never
above: it is a lower bound) and its memory at each stage less the lowered program's there (never
above).
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
from minidnn.memory.bound import step_time_floor
from minidnn.memory.costmodel import CachedCost, ProfileCost
from minidnn.memory.facts import Facts
from minidnn.memory.optimal import pareto, solve_reference
from minidnn.memory.optimal_model import INDEPENDENT_TIMINGS, PAIRED_TIMINGS, RECOMPUTE, Model
from minidnn.memory.planner import algorithm_options
from minidnn.memory.program import lower
from minidnn.memory.simulator import simulate
from minidnn.memory.transfers import step_curve
from minidnn.models.random_dag import SHAPE, RandomDag, random_spec

NETS = {
    "lenet5": ("LeNet-5 b8", lambda: models.lenet5(), (8, 1, 28, 28)),
    "resnet20": ("ResNet-20 b4", lambda: models.resnet20(), (4, 3, 32, 32)),
    "densenet_small": ("DenseNet-small b4", lambda: models.densenet_small(), (4, 3, 32, 32)),
    "vgg11": ("VGG-11 32x32 b4", lambda: models.vgg11(num_classes=10, image_size=32), (4, 3, 32, 32)),
    "dag0": ("random DAG 16 (seed 0)", lambda: RandomDag(random_spec(np.random.default_rng(0), 16)), SHAPE),
    "dag1": ("random DAG 24 (seed 1)", lambda: RandomDag(random_spec(np.random.default_rng(1), 24)), SHAPE),
}
TIMINGS = {"paired": PAIRED_TIMINGS, "independent": INDEPENDENT_TIMINGS}
# the heuristic's distance from the optimum above which the table explains where the plans differ
EXPLAIN_OVER = 0.05


def schedule_of(build, shape):
    graph = trace(build(), shape, loss=nn.CrossEntropyLoss())
    return build_schedule(graph, optimizer=optim.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4))


def rows_for(key, profile, fractions, time_limit, timings):
    label, build, shape = NETS[key]
    sched = schedule_of(build, shape)
    cost = CachedCost(ProfileCost(profile))
    config = MemoryConfig(profile=profile)
    unlimited = plan_memory(sched, config, cost)
    persistent = sched.persistent_bytes
    budgets = [(f"{f:.0%}", int(persistent + f * (unlimited.peak_bytes - persistent))) for f in fractions]
    budgets.append(("min", minimum_bytes(sched, config, cost)))
    out = []
    for name, budget in budgets:
        row = {"net": label, "steps": len(sched.steps), "budget": name, "bytes": budget,
               "base": unlimited.simulation.seconds}
        try:
            heuristic = plan_memory(sched, MemoryConfig(budget=budget, profile=profile), cost)
        except MemoryBudgetError:
            heuristic = None
        row["floor"] = step_time_floor(sched, budget, cost).seconds
        try:
            row["ref"] = solve_reference(sched, budget, cost, config, time_limit, heuristic=heuristic,
                                         timings=timings)
        except MemoryBudgetError as e:
            row["error"] = str(e).split(":")[0]
        row["heur"] = heuristic
        out.append(row)
    return out


def us(seconds, base=None):
    if seconds is None or not np.isfinite(seconds):
        return "-"
    return f"{seconds * 1e6:.3f}" + (f" ({seconds / base - 1:+.1%})" if base else "")


def print_table(rows):
    head = ("| network | steps | budget (KiB) | unlimited us | optimum us (vs unlimited) | proven bound us, gap "
            "| heuristic us: vs optimum | floor us: below optimum | search |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        cells = [r["net"], str(r["steps"]), f"{r['budget']} ({r['bytes'] / 1024:.1f})", us(r["base"])]
        h, base = r["heur"], r["base"]
        heur = us(h.simulation.seconds) if h is not None else "-"
        if "error" in r:
            print("| " + " | ".join(cells + [r["error"], "-", heur, us(r["floor"]), "-"]) + " |")
            continue
        ref = r["ref"]
        plan = ref.plan
        if plan is None:
            best = "none places" + (" (proven)" if ref.optimal else f" (none found; {ref.status})")
            bound = us(ref.bound)
            vs = f"{heur}: no plan of the reference to compare"
            fl = us(r["floor"])
        else:
            opt = plan.simulation.seconds
            best = us(opt, base) + (" optimal" if ref.optimal else f" best found ({ref.status})")
            bound = "= optimum" if ref.optimal else f"{us(ref.bound)}, gap {ref.gap:.2%}"
            if h is None:
                vs = "-"
            elif ref.optimal:
                vs = f"{heur}: {h.simulation.seconds / opt - 1:+.1%}"
            else:
                vs = f"{heur}: at most {h.simulation.seconds / ref.bound - 1:+.1%} (vs best found " \
                     f"{h.simulation.seconds / opt - 1:+.1%})"
            fl = f"{us(r['floor'])}: {opt / r['floor'] - 1:.1%}" if np.isfinite(r["floor"]) else "inf"
        search = f"{ref.candidates} ({ref.misplaced} over), {ref.seconds:.1f} s"
        print("| " + " | ".join(cells + [best, bound, vs, fl, search]) + " |")


def explain(rows):
    """The decisions where the heuristic's plan and the optimum differ, where it is over EXPLAIN_OVER."""
    for r in rows:
        ref, h = r.get("ref"), r["heur"]
        if ref is None or ref.plan is None or h is None or not ref.optimal:
            continue
        if h.simulation.seconds <= ref.plan.simulation.seconds * (1 + EXPLAIN_OVER):
            continue
        opt = ref.plan
        names = opt.schedule.tensors
        print(f"\n{r['net']} at {r['budget']}: heuristic {us(h.simulation.seconds)} us "
              f"(stalls {us(h.simulation.stall_seconds)}, recompute {us(h.simulation.recompute_seconds)}), "
              f"optimum {us(opt.simulation.seconds)} us (stalls {us(opt.simulation.stall_seconds)}, "
              f"recompute {us(opt.simulation.recompute_seconds)})")
        for key in sorted(set(h.evictions) | set(opt.evictions)):
            a, b = h.evictions.get(key), opt.evictions.get(key)
            if a != b:
                print(f"  {names[key[0]].name} gap {key[1]}: heuristic {_evict(a)}, optimum {_evict(b)}")
        for s in sorted(set(h.algos) | set(opt.algos)):
            a, b = h.algos.get(s), opt.algos.get(s)
            if (a.name if a else None) != (b.name if b else None):
                print(f"  step {s} ({opt.schedule.steps[s].label}): heuristic {a.name if a else '-'}, "
                      f"optimum {b.name if b else '-'}")


def _evict(ev):
    if ev is None:
        return "kept"
    if ev.kind == "recompute":
        return "recomputed"
    return f"offloaded (hold {ev.delay}, lead {ev.lead}{', early' if ev.early else ''})"


def agreement(profile, keys, trials=60):
    rng = np.random.default_rng(0)
    print("| network | steps | decisions | time: model / simulated - 1 | exact | memory per stage: model - lowered (B) |")
    print("|---|---|---|---|---|---|")
    for key in keys:
        label, build, shape = NETS[key]
        sched = schedule_of(build, shape)
        cost = CachedCost(ProfileCost(profile))
        options = pareto(algorithm_options(sched, cost))
        model = Model(Facts(sched), cost, options=options, timings=INDEPENDENT_TIMINGS)
        times, stage = [], []
        for _ in range(trials):
            ev = {}
            for gap in sorted(set(model.d) | set(model.o)):
                r = rng.random()
                if gap in model.d and r < 0.15:
                    ev[gap] = RECOMPUTE
                elif gap in model.o and r > 0.9:
                    pairs = sorted(model.pairs[gap], key=lambda e: (e.delay, e.lead, e.early))
                    ev[gap] = pairs[int(rng.integers(len(pairs)))]
            algos = {s: opts[int(rng.integers(len(opts)))][1] for s, opts in options.items()}
            seen = model.evaluate(ev, algos)
            if seen is None:
                continue
            program = lower(sched, ev, model.touch, algos)
            per = step_curve(program, len(sched.steps))
            modelled = np.array([max(e.value(seen.x) for e in model.points(s)) for s in range(model.n)])
            stage.append((modelled - per).max())
            times.append(seen.seconds / simulate(program, sched, cost, algos=algos).seconds - 1)
        exact = sum(abs(t) < 1e-9 for t in times)
        print(f"| {label} | {len(sched.steps)} | {len(times)} | {min(times):+.2%} to {max(times):+.2%} | {exact} | "
              f"{min(stage):.0f} to {max(stage):.0f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="v100-16gb")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds for each reference search")
    ap.add_argument("--fractions", default="0.8,0.6,0.4")
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--timings", choices=sorted(TIMINGS), default="paired",
                    help="the offload timings of the reference's decisions (besides the heuristic's own)")
    ap.add_argument("--agreement", action="store_true", help="the model against the lowering instead")
    args = ap.parse_args()
    if args.agreement:
        agreement(args.profile, args.nets.split(",") if args.nets != ",".join(NETS) else ["dag0", "dag1", "resnet20"])
        return
    fractions = [float(f) for f in args.fractions.split(",")]
    began = time.perf_counter()
    rows = []
    for key in args.nets.split(","):
        rows += rows_for(key, args.profile, fractions, args.time_limit, TIMINGS[args.timings])
    print(f"profile {args.profile}, {args.timings} timings, time limit {args.time_limit:g} s per search\n")
    print_table(rows)
    explain(rows)
    print(f"\n{time.perf_counter() - began:.0f} s in all")


if __name__ == "__main__":
    main()
