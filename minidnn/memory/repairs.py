"""The repairs a seed's plan goes through, in order, and the final ones the fastest plans go
through: small objects with ``applies`` and ``apply``.

Each repair sees the seed's best plan so far and a :class:`Step` of the search
(the problem, whether the seed may trade copies for recomputations, and the
time a plan found already sets); ``apply`` returns a candidate, or None. The
search considers every candidate and logs it (search.py). The copy timing and
the trades between copying and recomputing are transfers.py's.
"""
from __future__ import annotations

from dataclasses import dataclass

from .transfers import fastest, hide_transfers, offload_recomputations, recompute_stalled, restoring, stalls


@dataclass
class Step:
    """What a repair may read: the problem, whether the seed is free to choose between copying
    and recomputing (``convert``), and the best time found before this seed (``beat``; None:
    nothing to beat)."""

    problem: object
    convert: bool
    beat: float = None
    stalled: bool = True      # whether the last offload trade still stalled (or found nothing)

    def plan_fn(self, plan):
        """Decisions -> the placed plan, replayed only where it fits, with ``plan``'s algorithms (its
        lowering resumed from ``plan``'s where they share the first steps: program.lower's ``base``)."""
        p = self.problem
        return lambda ev: p.build(ev, plan.algos, keep_within=plan.keep_within, arena_limit=p.limit,
                                  base=plan.program)

    def behind(self, plan) -> bool:
        return self.beat is not None and plan.simulation.seconds >= self.beat


def _retimed(step, plan):
    """``plan`` with its copies retimed; where that still stalls (and may yet win), retimed once
    more from the retimed plan, whose lowering shows where recomputations restore what it prefetches."""
    p, fn = step.problem, step.plan_fn(plan)
    q = hide_transfers(fn, plan, p.facts, p.cost, p.limit, p.knobs)
    if q is not None and stalls(q, p.knobs) and not step.behind(q):
        q = fastest(q, hide_transfers(fn, q, p.facts, p.cost, p.limit, p.knobs))
    return q


class RetimeCopies:
    name, why = "timed copies", "copies held and prefetched to overlap compute"
    start = "best"            # the seed's plan a repair starts from: its best so far, its timed plan, or
                              # ("faster") its best from which the repair finds something

    def applies(self, plan, step) -> bool:
        return any(ev.kind == "offload" for ev in plan.evictions.values())

    def apply(self, plan, step):
        return _retimed(step, plan)


class OffloadRecomputations:
    """Recomputations offloaded where the copy stream has room beside the plan's own copies
    (``share``: that fraction of them, the costliest), retimed. Tried where the seed may convert,
    the plan is still ahead of the best found before, and (for a share below one) it stalls.
    With ``halving``, the share is halved again while the result still stalls (the memory left
    holds fewer copies early), down to one recomputation; the fastest result is the candidate."""

    start = "timed"           # both shares trade on the timed plan's stream

    def __init__(self, share, halving=False, chains=False):
        self.share, self.halving, self.chains = share, halving, chains
        self.name = (f"recomputations offloaded ({share:.0%}{', halved while it stalls' if halving else ''})"
                     + (", costliest chains first" if chains else ""))
        self.why = "the copy stream has room left during the forward"

    def applies(self, plan, step) -> bool:
        # the costlier half only where all of them still stalled (or did not fit)
        return (step.convert and not step.behind(plan) and (self.share == 1 or step.stalled)
                and any(ev.kind == "recompute" for ev in plan.evictions.values()))

    def apply(self, plan, step):
        share, best = self.share, None
        count = sum(ev.kind == "recompute" for ev in plan.evictions.values())
        while True:
            more = self._offloaded(plan, step, share)
            best = fastest(best, more)
            if not self.halving or (more is not None and not step.stalled) or share * count <= 1:
                return best
            share /= 2

    def _offloaded(self, plan, step, share):
        p = step.problem
        more = offload_recomputations(step.plan_fn(plan), plan, p.facts, p.cost, p.limit, share,
                                      self.chains)
        if more is None:
            return None
        more = fastest(more, _retimed(step, more))
        step.stalled = stalls(more, p.knobs)
        return more


class RecomputeStalled:
    why = "the compute waits for these copies longer than a recomputation takes"
    start = "faster"          # from the seed's best, or where nothing of it fits, the plan it improved on

    def __init__(self, name="stalled copies recomputed"):
        self.name = name

    def applies(self, plan, step) -> bool:
        return step.convert and not step.behind(plan) and any(ev.kind == "offload" for ev in plan.evictions.values())

    def apply(self, plan, step):
        p = step.problem
        out = recompute_stalled(step.plan_fn(plan), plan, p.facts, p.cost, p.knobs)
        return None if out is plan else out


class HoldChainInputs:
    """The plan's decisions lowered again with a horizon (program.lower's ``keep_within``): a value
    a chain restored stays until its next use within that many schedule steps, instead of being
    dropped and recomputed once more (a bottleneck's ReLU output, restored to recompute the next
    convolution's output, is read again by that convolution's backward one step later). The
    horizon starts at twice the plan's own (at least one) and doubles while the plan gets faster
    and still fits: a longer one holds more."""

    name = "chain inputs held to their next use"
    why = "a value a chain restores is recomputed again where its next use is steps away"
    start = "best"

    def applies(self, plan, step) -> bool:
        program = plan.program
        again = [program.origin[i] for i, s in enumerate(program.steps) if s.kind == "recompute"]
        return len(again) > len(set(again))

    def apply(self, plan, step):
        p, best = step.problem, None
        horizon = max(1, 2 * plan.keep_within)
        while horizon < len(p.schedule.steps):
            held = p.build(plan.evictions, plan.algos, keep_within=horizon, arena_limit=p.limit)
            if held.arena_bytes > p.limit or held.simulation.seconds >= (best or plan).simulation.seconds:
                break
            best, horizon = held, 2 * horizon
        return best


class KeepRecomputed:
    """The plan's recomputations undone (their tensors kept on the device) where its arena has
    room for them under the limit: the costliest per byte first (by the chain the plan's lowering
    runs before the touch that closes them, transfers.restoring), each kept where the plan still
    fits and is faster. The target search stops within a step of the highest target that fits,
    and the trades after it change what is held, so a plan often has room for a few."""

    name = "recomputations kept where the arena has room"
    why = "the plan is under the limit by more than some recomputed tensors take"
    start = "best"

    def applies(self, plan, step) -> bool:
        return step.convert and any(ev.kind == "recompute" for ev in plan.evictions.values())

    def apply(self, plan, step):
        p, best = step.problem, plan
        sched, touch = p.schedule, p.facts.touch
        redo = restoring(plan, len(sched.steps))
        ranked = sorted(((redo[touch[t][g + 1]] / sched.tensor_bytes[t], (t, g))
                         for (t, g), ev in plan.evictions.items() if ev.kind == "recompute"), reverse=True)
        for _, key in ranked:
            if sched.tensor_bytes[key[0]] > p.limit - best.arena_bytes:
                continue                 # no room for it in the arena as placed now
            evictions = {k: ev for k, ev in best.evictions.items() if k != key}
            kept = p.build(evictions, best.algos, keep_within=best.keep_within, arena_limit=p.limit,
                           base=best.program)
            if kept.arena_bytes <= p.limit and kept.simulation.seconds < best.simulation.seconds:
                best = kept
        return None if best is plan else best


# the order matters: copies are timed first (the trades read the timed plan's stream)
REPAIRS = (RetimeCopies(), OffloadRecomputations(1.0), OffloadRecomputations(0.5, halving=True),
           RecomputeStalled())
# the trades once more from the timed plan, the recomputations ranked by the chain the plan's
# lowering runs to restore them (transfers.restoring) rather than by their producer's step alone
BY_CHAIN = (OffloadRecomputations(1.0, chains=True), OffloadRecomputations(0.5, halving=True, chains=True),
            RecomputeStalled("stalled copies recomputed, after the chains' trades"))
# on each of the search's fastest plans (Search.finish), in order: how the lowering holds what a
# plan's chains restore, then what the room left under the limit can keep
FINISH = (HoldChainInputs(), KeepRecomputed())
