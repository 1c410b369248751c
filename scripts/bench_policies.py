"""Memory policies side by side: minidnn's ``auto`` against the papers' (one table, one run).

    python scripts/bench_policies.py [--json FILE] [--models vgg16,resnet50,...] [--profiles titanx-12gb]
                                     [--batch 32] [--cpu-nets resnet18_cifar,densenet_cifar] [--cpu-batch 16]
                                     [--steps 3] [--fractions 0.75,0.5] [--tol 0.01] [--jobs 2]

Device rows (VGG-16, ResNet-50, ResNet-152, GoogLeNet, DenseNet-121 at ImageNet
size on the device profiles) are planned only; CPU rows (a quarter-width
ResNet-18 and a DenseNet-BC for 32x32 images, on the ``cpu-2core`` profile)
are planned and then trained for real. For every registered policy:

- **min budget**: the smallest budget it meets (bisection over budgets with
  ``plan_memory`` to ``--tol`` of the liveness peak; exact for the
  budget-independent rule, sqrt(n) checkpointing, whose minimum is its own
  plan's peak), also as a share of the liveness peak;
- **peak / time @ f**: at the budget f x liveness peak, the plan's peak and its
  predicted step time relative to unlimited memory (the simulator's replay);
  for CPU rows also the **measured** step time relative to unlimited memory
  (``--steps`` steps alternating with an unlimited trainer's, the fastest of each);
- **time @ min** and **auto @ min**: the policy's predicted time at its own
  minimum budget, and ``auto``'s at that same budget.

A policy that cannot meet a budget is "-" there, also where ``plan_memory``
would have substituted its own everything-evicted minimum plan (detected with
``baselines.Recorded``). Below the table: every budget where ``auto`` is not
the fastest or not the smallest, the two targets from the papers, and the
case vDNN and moDNN report (VGG-16, batch 256, 224x224, in 12 GiB on the
Titan X profile): each paper's figure beside the policy's plan here.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import minidnn as mdn  # before NumPy: it sets OpenBLAS's thread timeout, read when NumPy loads OpenBLAS
import numpy as np

from minidnn import models, nn, optim
from minidnn.autograd import build_schedule
from minidnn.errors import MemoryBudgetError
from minidnn.graph import trace
from minidnn.memory import MemoryConfig, ProfileCost, plan_memory
from minidnn.memory.baselines import CheckpointSqrt, Recorded
from minidnn.memory.planner import algorithm_options, fastest, make_plan, minimum_bytes
from minidnn.memory.policies import POLICIES, get_policy
from minidnn.memory.facts import Facts

DEVICE_NETS = ["vgg16", "resnet50", "resnet152", "googlenet", "densenet121"]
CPU_NETS = {
    # ResNet-18's CIFAR topology at a quarter of the width: activations, not weights, dominate
    "resnet18_cifar": lambda: models.get("resnet18_cifar", widths=(16, 32, 64, 128)),
    "densenet_cifar": lambda: models.get("densenet_small", block_config=(4, 4, 4)),
}
SWAP_ONLY = ("swap", "vdnn_all", "vdnn_conv", "vdnn_dyn", "modnn")


def optimizer():
    return optim.SGD(lr=0.1, momentum=0.9)


def build(net_name, batch):
    if net_name in CPU_NETS:
        return CPU_NETS[net_name](), (batch, 3, 32, 32)
    try:                                     # skip drawing ImageNet weights when the helper exists
        from minidnn.report import shapes_only
    except ImportError:
        shapes_only = contextlib.nullcontext
    with shapes_only():
        return models.get(net_name), (batch,) + models.default_input(net_name)


class _Refused(Exception):
    pass


class _Strict(Recorded):
    """A policy that returns None ends the planning there: without this, ``plan_memory`` would build
    its own minimum plan only for the bench to discard it."""

    def _keep(self, out, idx):
        if (out if idx is None else out[idx]) is None:
            raise _Refused
        return super()._keep(out, idx)


class Bench:
    """Plans of one schedule on one profile, per policy and budget, memoized."""

    def __init__(self, schedule, profile, tol):
        self.sched, self.profile, self.tol = schedule, profile, tol
        self.base = plan_memory(schedule, MemoryConfig(profile=profile))
        self.live = self.base.peak_bytes
        self.floor = minimum_bytes(schedule, MemoryConfig(profile=profile))   # auto's everything-evicted plan
        self.plans = {}

    def plan(self, policy, budget):
        """The policy's own plan within ``budget``, or None where it cannot meet it."""
        key = (policy, int(budget))
        if key not in self.plans:
            self.plans[key] = self._plan(policy, int(budget))
        return self.plans[key]

    def _plan(self, policy, budget):
        if budget >= self.live:
            return self.base
        if policy == "none":
            return None
        if policy == "checkpoint_sqrt":         # no offloads to retime: one plan for every budget it meets
            fits = [p for (n, b), p in self.plans.items() if n == policy and p is not None and b <= budget]
            if fits:
                return fits[0]
        rec = None if policy == "auto" else _Strict(get_policy(policy))   # auto's fallback is its own
        try:
            plan = plan_memory(self.sched, MemoryConfig(budget=budget, policy=rec or policy, profile=self.profile))
        except (MemoryBudgetError, _Refused):
            return None
        return plan if rec is None or rec.owns(plan) else None

    def fallback(self, plan):
        """Whether an ``auto`` plan is the everything-evicted minimum plan_memory falls back to when
        auto's greedy does not fit within its rounds."""
        return plan.peak_bytes == self.floor and bool(plan.evictions)

    def time(self, plan):
        return plan.simulation.seconds / self.base.simulation.seconds if plan is not None else None

    def own_peak(self, policy):
        """The peak of a budget-independent rule's plan (its decisions do not depend on the budget)."""
        facts, cost = Facts(self.sched), ProfileCost(self.profile)
        algos = fastest(algorithm_options(self.sched, cost))
        ev = get_policy(policy).evictions(facts, math.inf, cost, algos)
        return make_plan(self.sched, ev, None, policy, facts=facts, algos=algos).peak_bytes

    def minimum(self, policy):
        if policy == "none":
            return self.live
        if isinstance(get_policy(policy), CheckpointSqrt):     # (vDNN times its prefetches to the budget)
            own = min(self.own_peak(policy), self.live)
            if self.plan(policy, own) is not None:
                return own
        # feasibility is not always monotone in the budget (placement can fragment more at a larger
        # budget with other decisions), so failures at budgets planned before do not bound the search
        return self.search(policy, lambda p: p is not None, seed_lo=False)

    def search(self, policy, ok, hi=None, seed_lo=True):
        """The smallest budget, to ``tol`` x liveness peak, whose plan satisfies ``ok`` (assumed monotone,
        and true at ``hi``); starts from the budgets already planned."""
        hi = self.live if hi is None else hi
        known = sorted((b, ok(p)) for (name, b), p in self.plans.items() if name == policy)
        hi = min([b for b, good in known if good and b <= hi], default=hi)
        lo = max([b for b, good in known if not good and b < hi and seed_lo],
                 default=self.base.lower_bound_bytes - 1)
        while hi - lo > self.tol * self.live:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if ok(self.plan(policy, mid)) else (mid, hi)
        return hi


def plan_rows(net_name, batch, profile, fractions, tol):
    """Every policy's minimum, its plan at each fixed budget, and the targets, for one net."""
    t0 = time.perf_counter()
    net, shape = build(net_name, batch)
    sched = build_schedule(trace(net, shape, loss=nn.CrossEntropyLoss()), optimizer=optimizer())
    b = Bench(sched, profile, tol)
    out = {"net": net_name, "batch": batch, "profile": profile, "liveness_peak": b.live,
           "lower_bound": b.base.lower_bound_bytes, "unlimited_seconds": b.base.simulation.seconds, "policies": {}}
    rows = out["policies"]
    for name in POLICIES:
        rows[name] = {"at": {}}
        for f in fractions:
            p = b.plan(name, f * b.live)
            rows[name]["at"][f] = None if p is None else {"peak": p.peak_bytes, "time": b.time(p),
                                                          "fallback": name == "auto" and b.fallback(p)}
        if name != "auto":
            rows[name]["min"] = b.minimum(name)
            rows[name]["time_at_min"] = b.time(b.plan(name, rows[name]["min"]))
    for name, r in rows.items():                # auto at every other policy's minimum budget
        if name != "auto":
            p = b.plan("auto", r["min"])
            r["auto_at_min"], r["auto_fallback"] = b.time(p), p is not None and b.fallback(p)
    auto = rows["auto"]
    auto["min"] = b.minimum("auto")             # (starts from the budgets just planned)
    auto["time_at_min"] = auto["auto_at_min"] = b.time(b.plan("auto", auto["min"]))
    # Dymem's figure: the memory auto needs to be as fast as layer-wise offload (vDNN_all at its own
    # minimum, and as plan_memory retimes it at the largest fixed budget)
    out["equal_time"] = []
    ref = rows["vdnn_all"]
    points = {ref["min"]: ref["time_at_min"]}
    cell = ref["at"][max(fractions)]
    if cell is not None:
        points.setdefault(cell["peak"], cell["time"])
    for m_ref, t_ref in sorted(points.items()):
        if t_ref is None or (b.time(b.plan("auto", m_ref)) or math.inf) > t_ref:
            continue
        need = b.search("auto", lambda p, t_ref=t_ref: p is not None and b.time(p) <= t_ref, m_ref)
        out["equal_time"].append({"ref": "vdnn_all", "ref_budget": m_ref, "ref_time": t_ref, "auto_budget": need,
                                  "saving": 1 - need / m_ref})
    # swap + recompute (auto) against swap-only at the same budget: the fastest swap-only policy at each
    # fixed budget, and the best case over every swap-only policy's own minimum
    out["swap_vs_hybrid"] = []
    for f in fractions:
        ts = [(rows[n]["at"][f]["time"], n) for n in SWAP_ONLY if rows[n]["at"][f] is not None]
        if ts and auto["at"][f] is not None:
            out["swap_vs_hybrid"].append({"where": f"{f:.0%}", "speedup": min(ts)[0] / auto["at"][f]["time"],
                                          "swap_only": min(ts)[1]})
    at_min = [(rows[n]["time_at_min"] / rows[n]["auto_at_min"], n) for n in SWAP_ONLY
              if rows[n]["auto_at_min"] is not None and rows[n]["time_at_min"] is not None]
    if at_min:
        sp, n = max(at_min)
        out["swap_vs_hybrid"].append({"where": f"{mib(rows[n]['min'])} MiB", "speedup": sp, "swap_only": n})
    out["plan_seconds"] = time.perf_counter() - t0
    return out


# -- real runs on the CPU backend ---------------------------------------------------------------
def trainer_for(net_name, batch, memory):
    net, shape = build(net_name, batch)
    net.init_parameters(0)
    trainer = mdn.compile(net, shape, nn.CrossEntropyLoss(), optimizer(), memory=memory, trace_every=0)
    rng = np.random.default_rng(0)
    batch = rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0])
    for _ in range(2):                       # the first steps run slower: caches, thread pools
        trainer.step(*batch)
    return trainer, batch


def timed(trainer, batch):
    t0 = time.perf_counter()
    trainer.step(*batch)
    return time.perf_counter() - t0


def measure(result, steps):
    """Measured step time of every feasible cell relative to unlimited memory: steps of the two
    alternate, and the fastest of each counts (other processes share the CPU: alternating keeps
    a change of load from landing on one side only, the minimum is the least disturbed)."""
    net, batch = result["net"], result["batch"]
    ref = trainer_for(net, batch, None)
    for name, r in result["policies"].items():
        for f, cell in r["at"].items():
            if cell is None:
                continue
            run = trainer_for(net, batch, MemoryConfig(budget=int(f * result["liveness_peak"]), policy=name))
            pairs = [(timed(*run), timed(*ref)) for _ in range(steps)]
            cell["measured_seconds"] = min(p for p, _ in pairs)
            cell["measured"] = cell["measured_seconds"] / min(u for _, u in pairs)


# -- the table ------------------------------------------------------------------------------------
def mib(n):
    return "-" if n is None else f"{n / 2**20:.0f}" if n >= 2**30 else f"{n / 2**20:.1f}"


def x(t, fallback=False):
    return "-" if t is None else f"x{t:.2f}" + ("*" if fallback else "")


def table(results, fractions):
    heads = ["net (batch)", "device", "policy", "min budget MiB (% liveness)"]
    for f in fractions:
        heads += [f"peak MiB @{f:.0%}", f"time @{f:.0%}", f"measured @{f:.0%}"]
    heads += ["time @ own min", "auto @ that budget"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for res in results:
        for name, r in res["policies"].items():
            cells = [f"{res['net']} ({res['batch']})", res["profile"], name,
                     f"{mib(r['min'])} ({r['min'] / res['liveness_peak']:.0%})"]
            for f in fractions:
                c = r["at"][f] or {}
                cells += [mib(c.get("peak")), x(c.get("time"), c.get("fallback")), x(c.get("measured"))]
            cells += [x(r["time_at_min"]), x(r["auto_at_min"], r.get("auto_fallback"))]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


WHY = {
    "recompute": "auto's recompute-only seed is planned only on schedules of at most "
                 "Knobs.baseline_seed_steps steps",
    "fallback": "no seed of auto fit within Search.fit's rounds, and plan_memory fell back to the "
                "everything-evicted minimum plan (marked *)",
}
RULE = {
    "vdnn_all": "offloading every layer input, copies hidden one layer at a time",
    "vdnn_conv": "offloading convolution inputs, copies hidden one layer at a time",
    "vdnn_dyn": "layer-wise offload with per-layer algorithm downgrades",
    "modnn": "largest-first offload with each prefetch as early as memory allows",
    "superneurons": "offloading convolution outputs and recomputing cheap layers",
    "checkpoint_sqrt": "recomputing sqrt(n)-segments",
    "swap": "swap-only greedy",
}


def findings(results, fractions):
    """Where auto is not the fastest or not the smallest (with the reason), and the papers' targets."""
    out = []
    for res in results:
        tag = f"{res['net']} on {res['profile']}"
        auto = res["policies"]["auto"]
        for name, r in res["policies"].items():
            if name == "auto":
                continue
            if r["min"] < auto["min"]:
                out.append(f"- {tag}: {name} meets {mib(r['min'])} MiB, auto needs {mib(auto['min'])} MiB")
            pairs = [(f"{f:.0%}", r["at"][f], auto["at"][f]) for f in fractions]
            pairs = [(w, c["time"], a["time"], a["fallback"]) for w, c, a in pairs if c and a]
            if r["time_at_min"] is not None and r["auto_at_min"] is not None:
                pairs.append((f"{mib(r['min'])} MiB", r["time_at_min"], r["auto_at_min"], r["auto_fallback"]))
            for where, t, ta, fell in pairs:
                if ta > t * 1.0005:
                    why = WHY["fallback"] if fell else WHY.get(name) or (
                        f"auto's greedy (per memory peak, by estimated cost per byte; then copies timed on the "
                        f"copy queue as far as memory allows) is predicted slower than {RULE.get(name, name)} here")
                    out.append(f"- {tag}: at {where} {name} x{t:.3f}, auto x{ta:.3f}: {why}")
    targets = []
    for res in results:
        tag = f"{res['net']} on {res['profile']}"
        for e in res["equal_time"]:
            targets.append(f"- {tag}: as fast as {e['ref']} at {mib(e['ref_budget'])} MiB (x{e['ref_time']:.2f}),"
                           f" auto needs {mib(e['auto_budget'])} MiB: {e['saving']:.0%} less memory"
                           " (target >= 31% on nonlinear nets)")
        if res["swap_vs_hybrid"]:
            targets.append(f"- {tag}: swap+recompute (auto) vs swap-only at the same budget (target >= 15% faster): "
                           + "; ".join(f"at {e['where']} {e['speedup'] - 1:+.0%} vs {e['swap_only']}"
                                       for e in res["swap_vs_hybrid"]))
    return out, targets


NOTES = """Notes:
- Workspaces: every plan starts from each convolution's fastest algorithm, whose workspace (whole-batch
  im2col or Winograd on the CPU backend) sets VGG-16's peak: where the layer-wise rules (vdnn_all,
  vdnn_conv) do not fit with these performance-optimal algorithms, they take every convolution's
  memory-optimal one (the paper's (m) configuration); vdnn_dyn, superneurons, modnn and auto trade
  algorithms for smaller workspaces step by step. Lower bounds count the smallest workspaces.
- vDNN prefetches a layer's input one layer ahead; here a ReLU is not in place, its backward holds
  three feature maps, and where the input of the convolution before it does not fit beside them the
  prefetch waits until it does (on VGG-16 b256 in 12 GiB, 3.06 GiB copied with nothing to hide it).
- A named policy that cannot meet a budget gets auto's everything-evicted minimum plan from plan_memory
  (under the policy's name); this table counts it as infeasible for that policy.
- checkpoint_sqrt and superneurons recompute memory-centrically (the lowering drops a recomputed chain
  after its last use in it, so a segment of k dropped tensors costs up to k(k+1)/2 forwards): their
  times are above the papers' "one extra forward"; their memory is not above the papers'.
- plan_memory retimes every policy's offloads when that is faster and fits, so the layer-wise rules are
  measured with transfers at least as well hidden as in vDNN.
- Sub-batching (moDNN) is the trainer's, for every policy, when plan_memory raises MemoryBudgetError;
  no row here sub-batches.
- Measured (CPU) times alternate steps with an unlimited-memory trainer and compare the fastest of
  each; other processes share the 2 cores, so they vary by about +-10% from run to run.
- Minimum budgets are bisections: where placement fragmentation makes feasibility non-monotone in the
  budget, a policy may also meet some smaller budgets (and fail some larger ones: "-" at a fixed budget
  above its minimum)."""


# the case both papers report: VGG-16 at batch 256 (224x224) in 12 GB on a GTX Titan X, with their figures
PAPERS_CELL = ("vgg16", 256, "titanx-12gb", 12 * 2**30)
PAPERS = {"vdnn_dyn": "vDNN (Rhu et al. 2016): +18%, vDNN_dyn", "vdnn_all": "vDNN_all(m): trains it",
          "vdnn_conv": "vDNN_conv(m): trains it", "modnn": "moDNN (Chen et al. 2018): about +3%"}


def papers_cell():
    """Lines: each paper's policy planned on the papers' case, beside the paper's figure, and auto."""
    net, batch, profile, budget = PAPERS_CELL
    sched = build_schedule(trace(build(net, batch)[0], (batch, 3, 224, 224), loss=nn.CrossEntropyLoss()),
                           optimizer=optimizer())
    lines = []
    for name in list(PAPERS) + ["auto"]:
        rec = None if name == "auto" else Recorded(get_policy(name))
        try:
            plan = plan_memory(sched, MemoryConfig(budget=budget, policy=rec or name, profile=profile))
        except MemoryBudgetError:
            plan = None
        if plan is None or (rec is not None and not rec.owns(plan)):
            got = "no plan"
        else:
            got = (f"{plan.peak_bytes / 2**30:.2f} GiB, {plan.simulation.seconds / plan.baseline.seconds - 1:+.1%}"
                   f" (stalls {plan.simulation.stall_seconds * 1e3:.0f} ms)")
        lines.append(f"- {name}: {got}" + (f"; paper: {PAPERS[name]}" if name in PAPERS else ""))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEVICE_NETS))
    ap.add_argument("--profiles", default="titanx-12gb")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--cpu-nets", default=",".join(CPU_NETS))
    ap.add_argument("--cpu-batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3, help="measured steps per CPU run (0: planning only)")
    ap.add_argument("--fractions", default="0.75,0.5", help="fixed budgets, as fractions of the liveness peak")
    ap.add_argument("--tol", type=float, default=0.01, help="bisection tolerance, fraction of the liveness peak")
    ap.add_argument("--jobs", type=int, default=2, help="processes planning in parallel")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args(argv)
    fractions = [float(f) for f in args.fractions.split(",")]
    # the longest to plan go first
    nets = sorted(filter(None, args.models.split(",")), key=lambda m: ("densenet" not in m, "152" not in m))
    tasks = [(m, args.batch, p, fractions, args.tol) for m in nets for p in args.profiles.split(",")]
    tasks += [(m, args.cpu_batch, "cpu-2core", fractions, args.tol) for m in filter(None, args.cpu_nets.split(","))]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(plan_rows, *zip(*tasks)))
    order = filter(None, (args.models + "," + args.cpu_nets).split(","))
    rank = {m: i for i, m in enumerate(order)}
    results.sort(key=lambda r: rank[r["net"]])
    t_plan = time.perf_counter() - t0
    if args.steps:
        for res in results:
            if res["profile"] == "cpu-2core":
                measure(res, args.steps)
    print(f"Predicted (and on the CPU measured) step time relative to unlimited memory; batch {args.batch} at"
          f" ImageNet size on the device profiles (planning only), batch {args.cpu_batch} at 32x32 on the CPU.\n")
    print(table(results, fractions))
    slower, targets = findings(results, fractions)
    print("\nWhere auto is not the fastest or the smallest:" + ("\n" + "\n".join(slower) if slower else " nowhere."))
    print("\nTargets:\n" + "\n".join(targets))
    net, batch, profile, budget = PAPERS_CELL
    print(f"\nThe papers' case, {net} batch {batch} (224x224) within {budget / 2**30:.0f} GiB on {profile}:\n"
          + "\n".join(papers_cell()))
    print("\n" + NOTES)
    print(f"\nplanned in {t_plan:.0f} s, total {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"fractions": fractions, "results": results}, fh, indent=1, default=str)


if __name__ == "__main__":
    sys.exit(main())
