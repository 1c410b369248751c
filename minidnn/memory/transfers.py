"""When a plan's copies run, and which recomputations become copies.

The policies decide what to evict; the search's repairs (repairs.py) time
each seed's copies on the copy stream (:func:`hide_transfers`) and, for a
seed free to choose between copying and recomputing, turn recomputations into
offloads where the stream has room left (:func:`offload_recomputations`) and
offloads that the compute still waits for into recomputations
(:func:`recompute_stalled`). Each candidate is lowered, placed and replayed by
the simulator; the fastest that fits the budget is kept.
"""
from __future__ import annotations

import bisect
import heapq
import math
from collections import defaultdict
from typing import NamedTuple

import numpy as np

from .knobs import Knobs
from .program import Evict, recompute_seconds
from .simulator import memory_curve


def fastest(*plans):
    """The plan predicted fastest among ``plans`` (None ones left out); None if there is none."""
    return min((p for p in plans if p is not None), key=lambda p: p.simulation.seconds, default=None)


def stalls(plan, knobs=Knobs()) -> bool:
    """Whether ``plan``'s compute still waits for copies for over ``knobs.stall_share`` of its step."""
    return plan.simulation.stall_seconds > knobs.stall_share * plan.simulation.seconds


def schedule_groups(program, n):
    """For each program step, the schedule step it belongs to: a compute step its own, a prefetch or a
    recomputation the step it is inserted before, an offload the step it follows."""
    group, last, pending = [0] * len(program.steps), 0, []
    for p, s in enumerate(program.steps):
        if s.kind == "offload":
            group[p] = last
        elif s.kind in ("prefetch", "recompute"):
            pending.append(p)
        else:
            last = group[p] = program.origin[p]
            for q in pending:
                group[q] = last
            pending.clear()
    for q in pending:
        group[q] = n - 1
    return np.array(group, np.int64)


def step_curve(program, n, group=None) -> np.ndarray:
    """The most arena bytes ``program`` holds during each of the schedule's ``n`` steps (``group``:
    schedule_groups(program, n), where the caller has it)."""
    curve = np.zeros(n, np.int64)
    np.maximum.at(curve, schedule_groups(program, n) if group is None else group, memory_curve(program))
    return curve


def timeline(plan, schedule):
    """(start time of each schedule step and the end of the last, as an array of n + 1; the most
    arena bytes held during each schedule step; the schedule step of each program step) of ``plan``,
    counting what is inserted before a step (prefetches, recomputations) as part of it."""
    program, n = plan.program, len(schedule.steps)
    group = schedule_groups(program, n)
    secs = np.zeros(n)
    np.add.at(secs, group, plan.simulation.costs)
    return np.concatenate([[0.0], np.cumsum(secs)]), step_curve(program, n, group), group


def restoring(plan, n) -> np.ndarray:
    """The seconds of the recomputations ``plan``'s lowering runs before each of the schedule's ``n``
    steps: the chain that restores what the step needs, with the plan's other decisions (a
    tensor whose inputs the plan drops too restores them as well; one held from an earlier chain
    costs nothing there)."""
    group = schedule_groups(plan.program, n)
    out = np.zeros(n)
    at = [p for p, s in enumerate(plan.program.steps) if s.kind == "recompute"]
    np.add.at(out, group[at], np.asarray(plan.simulation.costs)[at])
    return out


def offload_recomputations(plan_fn, plan, facts, cost, limit, share=1.0, chains=False):
    """``plan`` with the recomputations that cost the most per byte turned into offloads, as many
    as the copy stream can carry during the forward beside the plan's own offloads (``share``: that
    fraction of them, the costliest: by their producer's step per copy second, or with ``chains``
    by the chain the plan's lowering runs before the touch that closes them, :func:`restoring`,
    which offloading saves there); or None where that plan does not fit ``limit``.

    The policy charges copies a bias, because the copy stream is shared; once the plan's transfers
    are timed, what is left of the stream is known: a queue released over the forward steps fits
    by its end if, for every step, the copies released from it on fit in the time left."""
    schedule, touch, producer, last_forward = facts.schedule, facts.touch, facts.producer, facts.last_forward
    steps = schedule.steps
    cum = timeline(plan, schedule)[0]
    slack = cum[last_forward + 1] - cum[1:last_forward + 2]   # slack[a]: copy time left after step a
    if chains:
        chain = restoring(plan, len(steps))      # by the step a chain restores before
    else:
        secs = [cost.step_seconds(schedule, s, plan.algos.get(s.index)) for s in steps]
    chosen = []
    for (t, g), ev in plan.evictions.items():
        a = touch[t][g]
        x = cost.transfer_seconds(schedule.tensors[t].nbytes)
        if ev.kind == "offload":
            slack[:a + 1] -= x
        elif a <= last_forward and t in producer:
            redo = chain[touch[t][g + 1]] if chains else secs[producer[t].index]
            chosen.append((redo / x, (t, g), a, x))
    fitting = []
    for _, key, a, x in sorted(chosen, reverse=True):
        if slack[:a + 1].min(initial=math.inf) >= x:
            slack[:a + 1] -= x
            fitting.append(key)
    if not fitting:
        return None
    trial = dict(plan.evictions)
    trial.update((key, Evict("offload")) for key in fitting[:math.ceil(share * len(fitting))])
    better = plan_fn(trial)
    return better if better.arena_bytes <= limit else None


class Gap(NamedTuple):
    """An offloaded gap of a tensor between two touches: its key, the schedule steps of the touches
    that open (``a``) and close (``b``) it, its offload's hold (schedule steps after ``a``), the step
    its prefetch is issued before and the step it is due (a recomputation may read it before
    ``b``), one copy's seconds and its arena bytes."""

    key: tuple
    a: int
    b: int
    delay: int
    fetch: int
    due: int
    seconds: float
    size: int


def extend(gaps, curve, top, cum, reach, by_saving=True) -> dict:
    """{key: (hold, the step its prefetch is issued before)} for each of ``gaps``: its hold and
    its lead each extended as one stretch of schedule steps, as far as ``reach[key]`` = (the last
    step its offload may be held through, the earliest step its prefetch may be issued before,
    when its copy out ends, the latest its prefetch may start to arrive in time) asks, and each
    only into steps where ``curve`` (the arena bytes held during each schedule step, updated in
    place) stays at most ``top``: a stretch stops at the first step without room.

    Where memory is tight, the order decides who gets the room:

    - ``by_saving``: one step at a time, the step that saves the most stall per byte it holds
      first, whichever copy and direction it belongs to (a hold's step saves the part of it
      before the copy out ends: until then, the free waits for the copy; a lead's, the part of
      it after the latest start that arrives in time). So every copy gets its first step before
      any gets its second, as the exact reference spends tight memory;
    - else the queue's order, whole stretches, prefetches from the last due, then holds from the
      first released: a copy late on a queue delays every copy behind it, so the stall a step
      saves is not its own alone."""
    hold = {g.key: g.delay for g in gaps}
    fetch = {g.key: g.fetch for g in gaps}
    stretches = []                           # (gap, lead, its first step, the step after its last), in full
    for n, g in enumerate(gaps):
        last, first, end, start = reach[g.key]
        lead_from = min(g.fetch, max(first, int(np.searchsorted(cum, start, side="right")) - 1, g.a + g.delay + 2))
        hold_to = min(last, int(np.searchsorted(cum, end)) - 1, lead_from - 2)
        if lead_from < g.fetch:
            stretches.append((n, True, lead_from, g.fetch))
        if g.a + g.delay < hold_to:
            stretches.append((n, False, g.a + g.delay + 1, hold_to + 1))

    def take(n, lead, i, k):                 # steps i..k-1 of a stretch, as far as they have room
        g = gaps[n]
        full = np.flatnonzero(curve[i:k] > top - g.size)
        if lead:
            i = i + int(full[-1]) + 1 if len(full) else i
            fetch[g.key] = i
        else:
            k = i + int(full[0]) if len(full) else k
            hold[g.key] = k - 1 - g.a
        curve[i:k] += g.size

    if not by_saving:
        for n, lead, i, k in sorted(stretches, key=lambda r: (0, -gaps[r[0]].due) if r[1] else (1, gaps[r[0]].a)):
            take(n, lead, i, k)
        return {g.key: (hold[g.key], fetch[g.key]) for g in gaps}
    # a stretch whose steps all have room for every stretch in full competes with none: taken whole
    total = curve.copy()
    for n, lead, i, k in stretches:
        total[i:k] += gaps[n].size
    ends = {}
    heap = []
    for n, lead, i, k in stretches:
        if total[i:k].max() <= top:
            take(n, lead, i, k)
            continue
        ends[n, lead] = i if lead else k - 1   # its last step to take
        j = k - 1 if lead else i
        heap.append((-_saved(cum, reach[gaps[n].key], j, lead) / gaps[n].size, n, lead, j))
    heapq.heapify(heap)
    while heap:
        _, n, lead, j = heapq.heappop(heap)
        g = gaps[n]
        if curve[j] > top - g.size:
            continue                         # no room: this stretch stops here
        curve[j] += g.size
        if lead:
            fetch[g.key] = j
        else:
            hold[g.key] += 1
        if j != ends[n, lead]:
            j += -1 if lead else 1
            heapq.heappush(heap, (-_saved(cum, reach[g.key], j, lead) / g.size, n, lead, j))
    return {g.key: (hold[g.key], fetch[g.key]) for g in gaps}


def _saved(cum, reach, j, lead) -> float:
    """The stall that holding a copy's buffer during schedule step ``j`` saves: for a lead, the part
    of the step after the latest start that arrives in time; for a hold, the part before its copy
    out ends (``reach``: as for extend())."""
    _, _, end, start = reach
    return cum[j + 1] - max(cum[j], start) if lead else min(cum[j + 1], end) - cum[j]


def _split(cum, gap, hold, end, at, start):
    """(the last step the offload of ``gap`` is held through, the step its prefetch is issued before)
    where the hold wants to reach step ``hold`` (its copy out ends at ``end``) and the prefetch to
    be issued before step ``at`` (to start by ``start``): a prefetch is issued two steps after the
    hold at the soonest, so in a short gap the two share its steps. The split waits least: a free
    that waits for its copy out waits from the end of the last held step until ``end``, a step whose
    prefetch is issued late waits from ``start`` until it is issued (the first of equal splits,
    the longest hold). A hold shorter than ``at - 2`` issues the prefetch no sooner and waits
    longer, so only the steps from there to ``hold`` are tried."""
    def fetch(h):
        return min(gap.due, max(at, h + 2))
    best = min(range(hold, max(gap.a + gap.delay, at - 2) - 1, -1), default=hold,
               key=lambda h: max(0.0, end - cum[h + 1]) + max(0.0, cum[fetch(h)] - start))
    return best, fetch(best)


def hide_transfers(plan_fn, plan, facts, cost, limit, knobs=Knobs()):
    """``plan`` with its transfers retimed to overlap compute, or None where that does not fit.

    Each buffer is held after its offload until the copy is predicted done (``delay``), and each
    prefetch is issued early enough to arrive in time (``lead``), by one of two timings:

    - *queued*: the copy stream is a queue; offloads leave as soon as it lets them, and
      prefetches are issued as late as it allows them all to arrive in time, working back from
      the last. Holds and leads are long where many copies follow each other;
    - *own*: each copy as if the stream were free for it alone: shorter holds and leads, so
      less memory, which is what a tight budget has least of.

    Where holding a buffer longer or prefetching it earlier would lift the memory of its steps
    above the budget, it is held or prefetched only as far as the budget allows (the curve of
    schedule steps, less a headroom for what placement adds; extend(): on the queue in its
    order, each copy alone by the stall each step saves per byte); where the placed plan still exceeds
    ``limit``, the faster of two repairs: every extension kept twice the overshoot further
    below the room (only the buffers held where memory is tight give way) and a share of every
    extension, bisected for. The queued timing is tried
    first; where it does not fit or still stalls (``knobs.stall_share``), the own timing too,
    and the faster plan wins."""
    offloads = sorted((k, ev) for k, ev in plan.evictions.items() if ev.kind == "offload")
    if not offloads:
        return None
    schedule, touch = facts.schedule, facts.touch
    cum, base, group = timeline(plan, schedule)
    fetched = defaultdict(list)          # tensor -> the schedule steps its prefetches are inserted before
    for p, st in enumerate(plan.program.steps):
        if st.kind == "prefetch":
            fetched[st.writes[0]].append(int(group[p]))

    def needed(t, a, b):                 # the gap's first prefetch: a recomputation may restore it before b
        at = fetched.get(t, [])
        i = bisect.bisect_right(at, a)
        return min(b, at[i]) if i < len(at) else b

    gaps = []
    for k, ev in offloads:
        a, b = touch[k[0]][k[1]], touch[k[0]][k[1] + 1]
        lo = max(a + 1, b - ev.lead)
        gaps.append(Gap(k, a, b, ev.delay, lo, min(lo, needed(k[0], a, b)),
                        cost.transfer_seconds(schedule.tensors[k[0]].nbytes), int(schedule.tensor_bytes[k[0]])))
    # a copy out whose gap opens with a touch that only reads the tensor is issued beside that touch
    # (program.Evict.early): it is done a step sooner and frees nothing later
    early = {g.key: plan.evictions[g.key].early or facts.only_reads(g.key[0], g.a) for g in gaps}
    by_release = sorted(gaps, key=lambda g: g.a)                     # the offloads' order on the queue
    by_due = sorted(gaps, key=lambda g: -g.due)                      # the prefetches', last first
    # the plan's fragmentation headroom, and a share of the limit for what placing the longer-held buffers adds
    room = limit - (plan.arena_bytes - int(base.max(initial=0))) - int(limit * knobs.placement_headroom)

    def targets(queued):
        """{key: (the last step its offload is held through, the earliest step its prefetch is
        issued before, when its copy out ends, the latest its prefetch may start to arrive in
        time)}, unclamped by memory."""
        out, t_x, nxt = {}, 0.0, math.inf
        for g in by_release:
            issued = cum[g.a] if early[g.key] else cum[g.a + 1]
            t_x = (max(issued, t_x) if queued else issued) + g.seconds
            out[g.key] = [g.a + max(g.delay, min(int(np.searchsorted(cum, t_x)) - (g.a + 1), g.b - g.a - 2)),
                          None, t_x, None]
        for g in by_due:
            nxt = (min(cum[g.due], nxt) if queued else cum[g.due]) - g.seconds
            at = int(np.searchsorted(cum, nxt, side="right")) - 1
            r = out[g.key]
            r[0], r[1] = _split(cum, g, r[0], r[2], at, nxt)
            r[3] = nxt
        return out

    def extended(reach, queued, share, headroom):
        """The evictions with their holds and leads extended by ``share`` of the way to ``reach``
        (targets()), as memory allows (extend(), in the order of reach's timing)."""
        reach = {g.key: (g.a + g.delay + math.ceil(share * (r[0] - g.a - g.delay)),
                         g.fetch - math.ceil(share * (g.fetch - r[1])), r[2], r[3])
                 for g in gaps for r in [reach[g.key]]}
        timed = extend(gaps, base.copy(), room - headroom, cum, reach, by_saving=not queued)
        trial = dict(plan.evictions)
        trial.update((g.key, Evict("offload", delay=timed[g.key][0], lead=g.b - timed[g.key][1],
                                   early=early[g.key])) for g in gaps)
        return trial

    def fitted(queued):
        """The fastest plan found that fits, or None: the extensions in full; where placement
        overshoots, both the full extensions held below the room by twice the overshoot (buffers
        held where memory is tight give way, the others keep their extension) and the largest
        share of every extension that fits (bisected)."""
        reach = targets(queued)
        trial = extended(reach, queued, 1.0, 0)
        if trial == plan.evictions:
            return None
        first = plan_fn(trial)
        if first.arena_bytes <= limit:
            return first
        held = plan_fn(extended(reach, queued, 1.0, 2 * (first.arena_bytes - limit)))
        share, lo_share, hi_share, fit = 0.5, 0.0, 1.0, None
        for _ in range(knobs.copy_timing_tries - 1):
            trial = extended(reach, queued, share, 0)
            if trial == plan.evictions:
                break
            better = plan_fn(trial)
            if better.arena_bytes <= limit:
                fit, lo_share = better, share
            else:
                hi_share = share
            share = (lo_share + hi_share) / 2
        return fastest(fit, held if held.arena_bytes <= limit else None)

    on_queue = fitted(queued=True)
    if on_queue is not None and not stalls(on_queue, knobs):
        return on_queue
    return fastest(on_queue, fitted(queued=False))


def recompute_stalled(plan_fn, plan, facts, cost, knobs=Knobs()):
    """``plan`` with the offloads that its compute waits for turned into recomputations, again
    while that is predicted faster. A wait (a prefetch arriving late, or a free waiting for its
    offload) means the copy stream is behind: recomputing the tensor in the backward takes its
    two copies off the stream, which is worth it where they are predicted to take over
    ``knobs.stalled_worth`` of the step longer than its producer's forward."""
    schedule, touch, producer, last_forward = facts.schedule, facts.touch, facts.producer, facts.last_forward
    steps = schedule.steps
    secs = [cost.step_seconds(schedule, s) for s in steps]
    for _ in range(knobs.stalled_rounds):
        least = knobs.stalled_worth * plan.simulation.seconds
        trial = dict(plan.evictions)
        for wait, t, n in _waited_copies(plan, least):
            src = producer.get(t)
            if src is None or (min(wait, 2 * cost.transfer_seconds(schedule.tensors[t].nbytes))
                               - cost.step_seconds(schedule, src, plan.algos.get(src.index)) <= least):
                continue
            # the offloaded gap around schedule step n, where its end can recompute it
            gaps = [g for (u, g), ev in plan.evictions.items() if u == t and ev.kind == "offload"
                    and touch[t][g] <= n <= touch[t][g + 1] and touch[t][g + 1] > last_forward
                    and math.isfinite(recompute_seconds(t, touch[t][g + 1], touch, producer, secs, schedule.tensors))]
            if gaps:
                trial[t, gaps[0]] = Evict("recompute")
        if trial == plan.evictions:
            return plan
        better = plan_fn(trial)
        if better.simulation is None or better.simulation.seconds >= plan.simulation.seconds:
            return plan
        plan = better
    return plan


def _waited_copies(plan, least):
    """(seconds, tensor, schedule step) of each copy that ``plan``'s compute waits for over ``least`` seconds:
    a prefetch that arrives after its step would start, or an offload that a free waits for
    (the schedule step: the one the prefetch is for, or the one the offload follows)."""
    sim, program = plan.simulation, plan.program
    group = schedule_groups(program, len(plan.schedule.steps))
    out = []
    done = 0.0                                  # when the compute stream finished its last step
    pending = {}                                # tensor -> its prefetch's program step
    for i, s in enumerate(program.steps):
        if s.kind == "prefetch":
            pending[s.writes[0]] = i
            continue
        if s.kind == "offload":
            continue
        late = max(((sim.end[p], t) for t, p in pending.items() if t in s.touched), default=None)
        if late is not None and late[0] - done > least and sim.start[i] == late[0]:
            out.append((late[0] - done, late[1], int(group[i])))    # it waited for the latest of its prefetches
        for t in s.touched:
            pending.pop(t, None)
        done = sim.end[i]
    waited = {}                                 # free step -> (when its latest offload ends, tensor, offload)
    for r in program.residencies:
        j = r.wait_offload
        if j is not None and sim.end[j] > waited.get(r.end, (-1.0,))[0]:
            waited[r.end] = (sim.end[j], r.tensor, j)
    out += [(sim.end[e] - sim.start[e] - sim.costs[e], t, int(group[j])) for e, (_, t, j) in waited.items()
            if sim.end[e] - sim.start[e] - sim.costs[e] > least]
    return out
