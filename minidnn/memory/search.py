"""The planner's search: seeds and repairs over one problem, every trial logged.

A :class:`Problem` is what is fixed while planning one schedule under one
budget (the schedule, the cost model, the touches, the arena limit, the
algorithm options and the fastest algorithms, and a ``build`` that lowers,
places and replays decisions into a Plan). A :class:`Search` plans each seed
(a policy's chooser, searched over targets until its placed plan fits), runs
the explicit list of repairs on it (repairs.py: time its copies, trade copies
and recomputations), then the final repairs on the fastest few plans (hold what
chains restore, keep recomputed tensors where the arena has room), and
``consider``s every candidate: one is kept only if it fits and is predicted
faster than the best so far. Each trial is logged with what was tried, why,
its bytes and seconds, and whether it was kept; the plan that wins carries the
log, and its summary says why it won.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from .baselines import CheckpointSqrt
from .greedy import AutoPolicy
from .knobs import Knobs
from .policies import BASELINES, get_policy
from .program import lower
from .simulator import memory_curve, simulate
from .repairs import BY_CHAIN, FINISH, REPAIRS, RetimeCopies, Step


@dataclass(frozen=True)
class Trial:
    """One line of the search log."""

    what: str                 # the seed or repair tried
    why: str                  # what it is for
    bytes: int = None         # the candidate's arena bytes (None: no candidate)
    seconds: float = None     # its predicted step time
    kept: bool = False        # whether it became the best plan

    def __str__(self):
        got = (f"{self.bytes / 2**30:.2f} GiB, {self.seconds * 1e3:.1f} ms" if self.bytes is not None
               else "no plan")
        return f"{'kept' if self.kept else 'tried'} {self.what} ({self.why}): {got}"


@dataclass
class Problem:
    """What is fixed while planning: the schedule's facts (facts.Facts), cost model, arena limit,
    algorithm options, the fastest algorithms, ``build(evictions, algos, program, simulation,
    keep_within, arena_limit, base) -> Plan`` (planner.Builds) and the unlimited step's predicted
    seconds; ``packed``: () -> such a ``build`` whose placement packs an arena over the limit
    tighter (placement.place_program's ``pack``; None: none)."""

    facts: object
    cost: object
    limit: int
    options: dict
    fastest: dict
    build: object
    baseline_seconds: float
    knobs: Knobs = field(default_factory=Knobs)
    packed: object = None

    @property
    def schedule(self):
        return self.facts.schedule

    def chooser(self, policy):
        return policy.chooser(self.facts, self.cost, self.options, self.fastest)


def seeds(policy, problem):
    """(name, why, chooser, convert, prune) of every seed for ``policy``: the policy alone, or
    for the hybrid ``auto`` also swap-only, the copies-free ranking, Chen's sqrt(n) segments and,
    on schedules of at most ``knobs.baseline_seed_steps`` steps, recompute-only, the papers'
    policies (so that ``auto`` is at or below each of them by construction), the greedy asked for
    less than the limit (room left for its copies' timing), the greedy charging copies in full, and
    the greedy with the copy stream's room by direction; the greedy with its chains' copies hidden
    there, or on any schedule where ``knobs.hidden_chain_seed`` (the split choice's search)."""
    if not (isinstance(policy, AutoPolicy) and policy.hybrid):
        return [(policy.name, "the policy asked for", problem.chooser(policy), False, True)]
    sched, knobs = problem.schedule, problem.knobs
    k = knobs
    greedy = AutoPolicy(name=policy.name, knobs=k)
    out = [("greedy", "offload or recompute at the peak, by predicted cost", problem.chooser(greedy), True, True),
           ("swap-only", "every eviction a copy", problem.chooser(AutoPolicy(recompute=False, knobs=k)), False,
            True)]
    if problem.cost.copy_overlap < 1:
        out.append(("copies-free", "copies ranked as if they took nothing from compute",
                    problem.chooser(AutoPolicy(copies_free=True, knobs=k)), True, True))
    sqrt = CheckpointSqrt()
    if sqrt.rework(problem.facts) <= knobs.sqrt_rework:
        segments = None

        def sqrt_chooser(target):        # the same segments for every target: computed once
            nonlocal segments
            if segments is None:
                segments = sqrt.evictions(problem.facts, math.inf, problem.cost, problem.fastest) or {}
            return (segments or None), problem.fastest
        out.append(("checkpoint_sqrt", "Chen et al.'s sqrt(n) segments, then copies where the stream has room",
                    sqrt_chooser, True, False))   # (not pruned: the horizon search removes their rework)
    def hidden_seed():
        hidden = dataclasses.replace(k, chain_copy_share=0.0)
        return ("greedy, chain copies hidden", "a chain's prefetches charged nothing (the copy timing may issue "
                "them early)", problem.chooser(AutoPolicy(name=policy.name, knobs=hidden)), True, False)
    if len(sched.steps) > knobs.baseline_seed_steps and knobs.hidden_chain_seed:
        out[1:1] = [hidden_seed()]
    if len(sched.steps) <= knobs.baseline_seed_steps:
        # the greedy asked for less than the limit: the room left is where the copy timing holds its
        # offloads until their copies are done and prefetches them early (not pruned: before their
        # copies are timed these plans evict more, so they are slower)
        greedy_choose = out[0][2]
        out[1:1] = [(f"greedy, {1 - f:.0%} left for its copies", "the copy timing's holds and early prefetches "
                     "need memory the greedy does not plan for", _scaled(greedy_choose, f), True, False)
                    for f in knobs.copy_room]
        out[1:1] = [(f"greedy, copies charged {bias:.0%} where their gaps hide them",
                     "a copy charged otherwise than the greedy does where its gap hides it: copies that cluster "
                     "in a few layers queue on the one stream, and copies of small tensors hide beside them",
                     problem.chooser(AutoPolicy(name=policy.name, knobs=dataclasses.replace(k, copy_bias=bias))),
                     True, False) for bias in knobs.copy_biases]
        out[1:1] = [("greedy, offloads timed at the peak", "an offload's buffer held while its copies run, "
                     "within its gap's side of the peak it lowers",
                     problem.chooser(AutoPolicy(name=policy.name, knobs=dataclasses.replace(k, timed_offloads=True))),
                     True, False)]
        out[1:1] = [hidden_seed(),
                    ("recompute-only", "every eviction a recomputation",
                     problem.chooser(AutoPolicy(offload=False, knobs=k)), False, True)]
        # not pruned: their copies are timed by the repairs, which is where they can win
        out += [(name, "a paper's policy as a seed", problem.chooser(get_policy(name)), False, False)
                for name in BASELINES]
        # last, so that no seed before it is pruned against it; not pruned: its raw plan may be
        # slower, its timed copies are where it wins
        out.append(("greedy, copy stream by direction", "copies out in the forward and prefetches in the "
                    "backward each fit their own queue (as the copy timing runs them)",
                    problem.chooser(AutoPolicy(name=policy.name, knobs=k, copy_windows=True)), True, False))
    return out


BEATEN = "beaten"   # fit's attempt: the plan cannot beat the one to beat


def _scaled(choose, share):
    """``choose`` asked for ``share`` of every target."""
    return lambda target: choose(int(share * target))


class Search:
    """The search over one :class:`Problem`: ``run(policy)`` plans every seed and keeps the fastest
    plan that fits; ``log`` holds every trial."""

    def __init__(self, problem):
        self.p = problem
        self.best = None          # the fastest plan that fits
        self.beat = None          # the fastest seed plan before its copies were timed
        self.log = []
        self.memo = {}            # lowerings by decisions
        self.fits = []            # (plan, what) of every candidate that fit, where the final repairs run
        self.packing = None       # (the problem with packed placement, its lowerings), once asked for
        self.misplaced = False    # whether the last fit() placed a candidate within the limit live, over it placed
        # (each a lowering and a replay or more: on schedules as short as the baseline seeds')
        self.finishes = len(problem.schedule.steps) <= problem.knobs.baseline_seed_steps

    def consider(self, plan, what, why) -> bool:
        """Keep ``plan`` if it fits and is predicted faster than the best; log it either way."""
        fits = plan is not None and plan.arena_bytes <= self.p.limit
        kept = fits and (self.best is None or plan.simulation.seconds < self.best.simulation.seconds)
        self.log.append(Trial(what, why, plan.arena_bytes if plan is not None else None,
                              plan.simulation.seconds if plan is not None and plan.simulation else None, kept))
        if kept:
            self.best = plan
        if fits and self.finishes:
            self.fits.append((plan, what))
        return kept

    def run(self, policy):
        for name, why, choose, convert, prune in seeds(policy, self.p):
            if name == "checkpoint_sqrt" and not self.worth_segments():
                self.log.append(Trial(name, "not tried: the best plan is within one extra forward's share"))
                continue
            if not self.seed(name, why, choose, convert, prune) and self.misplaced and self.p.packed is not None:
                self.seed_packed(name, why, choose, convert, prune)
        if self.best is not None and self.finishes:
            self.finish(isinstance(policy, AutoPolicy) and policy.hybrid)
        return self.best

    def finish(self, convert):
        """The final repairs (repairs.FINISH), in order, on each of the ``knobs.finish_plans`` fastest
        plans that fit with different decisions, each candidate logged after the trial it repairs
        (``convert``: whether they may change what a plan evicts, as the hybrid may): a seed's plan
        that is slower but has room under the limit may keep more and end faster."""
        step, seen, plans = Step(self.p, convert), set(), []
        for plan, what in sorted(self.fits, key=lambda pw: pw[0].simulation.seconds):
            key = frozenset(plan.evictions.items())
            if key not in seen:
                seen.add(key)
                plans.append((plan, what))
        for plan, what in plans[:self.p.knobs.finish_plans]:
            for repair in FINISH:
                if not repair.applies(plan, step):
                    continue
                out = repair.apply(plan, step)
                if out is None:
                    self.log.append(Trial(f"{what} + {repair.name}", repair.why + ": nothing faster that fits"))
                    continue
                self.consider(out, f"{what} + {repair.name}", repair.why)
                plan, what = out, f"{what} + {repair.name}"

    def worth_segments(self) -> bool:
        """Whether sqrt(n) segments may beat the best plan: they recompute about one forward (a
        third of a step), so not a plan within ``knobs.segments_over`` of the unlimited step."""
        base = self.p.baseline_seconds
        return self.best is None or self.best.simulation.seconds > (1 + self.p.knobs.segments_over) * base

    def seed_packed(self, name, why, choose, convert, prune):
        """The seed again, its candidates and its repairs' packed tighter where they are over the
        limit (placement.place_program's ``pack``): where a seed finds nothing that fits and a
        candidate of it was within the limit live but over it placed, the default placement is why (ResNet-50 b1 at 6000x6000 in 8 GiB on v100-16gb: every
        hybrid seed's program holds 6.44 GiB live at best, placed in 8.58 GiB earliest first, 6.97
        GiB longest first, and the arena limit is 7.71 GiB). Only there: where a seed fits, a
        tighter packing lets higher targets fit, which leave its copy timing less room (ResNet-50
        b256 at 16% of its liveness peak on a100-40gb, 4 x 64: 849.2 ms as it is, 885.6 ms with
        every candidate packed)."""
        if self.packing is None:
            self.packing = (dataclasses.replace(self.p, build=self.p.packed(), packed=None), {})
        default = self.p, self.memo
        self.p, self.memo = self.packing
        try:
            self.seed(f"{name}, packed", why, choose, convert, prune)
        finally:
            self.p, self.memo = default

    def seed(self, name, why, choose, convert, prune) -> bool:
        """Plan one seed: its target searched until it fits, a horizon for its chains where it
        recomputes them again and again, then its copies timed. Whether anything fit."""
        plan = self.fit(choose, beat=self.beat if prune else None)
        if plan is not None and self.rechains(plan):
            plan = self.keep_chains(choose, plan)
        if plan is None:
            self.log.append(Trial(name, why + (": nothing that fits" if not prune or self.beat is None
                                               else ": nothing that fits and may be faster")))
            return False
        self.beat = min(self.beat or math.inf, plan.simulation.seconds)
        # what the repairs must beat (an unpruned seed is refined in full)
        prior = self.best.simulation.seconds if self.best is not None and prune else None
        self.consider(plan, name, why)
        step = Step(self.p, convert, prior)
        start = {"best": plan, "timed": plan}    # the seed's best so far, and its timed plan
        faster = [plan]                          # the seed's plans that fit, each faster than the last
        timed = None
        for repair in REPAIRS:
            self.repair(name, repair, step, start, faster)
            if isinstance(repair, RetimeCopies):
                start["timed"] = start["best"]
                timed = dict(start), list(faster)
        # the trades again, their recomputations ranked by chain: on schedules where another lowering
        # and replay per trade stay cheap (knobs.baseline_seed_steps)
        if timed is not None and step.convert and len(self.p.schedule.steps) <= self.p.knobs.baseline_seed_steps:
            start, faster = timed
            step.stalled = True
            for repair in BY_CHAIN:
                self.repair(name, repair, step, start, faster)
        return True

    def repair(self, name, repair, step, start, faster):
        """Try ``repair`` on the seed's plan it starts from (``start``; "faster": its best so far, or
        where nothing comes of that, the one before) and consider what it gives."""
        bases = [b for b in (faster[::-1] if repair.start == "faster" else [start[repair.start]])
                 if repair.applies(b, step)]
        if not bases:
            return
        out = next((out for out in map(lambda b: repair.apply(b, step), bases) if out is not None), None)
        if out is None:
            self.log.append(Trial(f"{name} + {repair.name}", repair.why + ": nothing that fits"))
            return
        self.consider(out, f"{name} + {repair.name}", repair.why)
        if out.arena_bytes <= self.p.limit and out.simulation.seconds < start["best"].simulation.seconds:
            start["best"] = out
            faster.append(out)

    def rechains(self, plan) -> bool:
        """Whether the plan's recomputations mostly recompute chains of dropped inputs again and again."""
        chosen = sum(ev.kind == "recompute" for ev in plan.evictions.values())
        return chosen > 0 and sum(s.kind == "recompute" for s in plan.program.steps) > self.p.knobs.rechain * chosen

    def keep_chains(self, choose, best):
        """The fastest of ``best`` and plans whose lowering keeps recomputed chain inputs for their
        next use within a horizon, doubled while that keeps getting faster: a longer horizon
        recomputes less but holds more, so at some point the policy must evict more to fit."""
        horizon = self.p.knobs.horizon
        while horizon < len(self.p.schedule.steps):
            plan = self.fit(choose, keep_within=horizon, beat=best.simulation.seconds)
            if plan is None or plan.simulation.seconds >= best.simulation.seconds:
                break
            best, horizon = plan, 2 * horizon
        return best

    def fit(self, choose, beat=None, keep_within=0):
        """The fastest plan found whose exact placement fits the limit, or None.

        ``choose``: target -> (evictions, algorithms). The greedy's lowered program
        (horizon 0) stays within its target (greedy.py); placement (fragmentation),
        a longer horizon, or a baseline's own rule add on top, which is known only
        afterwards. So the target is searched: lowered by at least the overshoot
        until a plan fits, then bisected between the highest target that fit and
        the lowest that did not. Where the policy cannot go as low as the
        overshoot asks, the target is bisected between there and the lowest that
        did not fit: random DAG 16 (seed 0) @ 40% on v100, the greedy with its
        offloads timed, packed: at the 5094 B limit its plan holds 4800 B and
        places in 5824 B, at 4364 B it is stuck, and at 4729 B its plan places in
        4672 B (303.0 us, the fastest plan found there).

        With ``beat`` (the step time of a plan found already), a search in which no
        plan has fit yet ends at an attempt predicted to take ``beat`` or longer
        (the simulation does not depend on placement, so it is not placed): a
        lower target is a longer prefix of the same greedy decisions, so it is
        rarely faster.
        """
        p, memo, limit = self.p, self.memo, self.p.limit
        best = None
        self.misplaced = False

        def attempt(target):
            ev, chosen = choose(target)
            if ev is None:
                return None, None
            key = (frozenset(ev.items()), frozenset(chosen.items()), keep_within)
            if key not in memo:                  # (a fixed rule answers every target alike)
                program = lower(p.schedule, ev, p.facts, chosen, keep_within,
                                checkpoints=p.knobs.lowering_checkpoints)
                memo[key] = [program, int(memory_curve(program).max(initial=0)), None, None]
            entry = memo[key]
            program, live, sim, plan = entry
            if live > limit:                     # only a candidate that can fit is worth placing
                return None, live
            if sim is None:
                sim = entry[2] = simulate(program, p.schedule, p.cost, algos=chosen)
            if beat is not None and best is None and sim.seconds >= beat:
                return None, BEATEN              # cannot win, nor (nearly always) can a lower target
            if plan is None:
                plan = entry[3] = p.build(ev, chosen, program, sim, keep_within)
            if plan.arena_bytes > limit:
                self.misplaced = True
                return None, plan.arena_bytes
            return plan, None

        step = max(limit // 64, 1)
        fit = miss = None                        # highest target that fit, lowest that did not
        low = 0                                  # a target the policy cannot go down to, nothing fitting yet
        target = limit
        for _ in range(p.knobs.fit_rounds):
            plan, need = attempt(target)
            if need is BEATEN:
                return best
            if plan is not None:
                fit = target
                if best is None or plan.simulation.seconds < best.simulation.seconds:
                    best = plan
            elif need is None and best is None:  # the policy cannot go this low: try between
                low = target
            else:
                miss = target
            if best is None:
                # lowered by the overshoot, but not to where the policy is known to get stuck (a
                # lower target is a longer prefix of its decisions: one that places may lie between)
                if need is None and (miss is None or miss - low <= step):
                    return None
                target = (low + miss) // 2 if need is None else max(target - max(need - limit, step),
                                                                    (low + target) // 2)
                if target <= low:
                    return None
            elif miss is None or miss - fit <= step:
                break
            else:
                target = (fit + miss) // 2
        return best
