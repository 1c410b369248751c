"""The hybrid greedy: evict at the peak, on the memory curve the lowering will really have.

The curve is kept per schedule step, as the most bytes held during any program
step the lowering runs for it (its prefetches, the recomputation chain that
restores what it needs, the step itself, the offloads after it). Evicting a
tensor for a gap frees its bytes inside the gap; a recomputation also makes
the closing step run a chain (:func:`program.restore_order`, the lowering's own
walk), whose values are held on top of what is on the device before it
(:func:`program.restore_footprint`), and every chain that reads the tensor
inside the gap now restores it too. So after every decision the curve equals
``memory_curve(lower(...))`` grouped by schedule step, byte for byte (with the
lowering's horizon ``keep_within=0``, and the copies untimed or, with
``Knobs.timed_offloads``, held and prefetched early as the greedy timed them for
the peaks they lower), and a decision that
would lift some step to the peak it was meant to lower is not taken: the
peaks it records never rise.
"""
from __future__ import annotations

import bisect
import math
from collections import defaultdict

import numpy as np

from ..schedule import aligned
from .knobs import Knobs
from .program import Evict, recompute_seconds, restore_footprint, restore_order, workspace_bytes


class AutoPolicy:
    """minidnn's planner: per gap, offload or recompute by predicted cost, greedily at the peak.

    Repeatedly takes the step where the most bytes are live and evicts, among
    the tensors idle across it, the one that frees the most bytes per second
    of predicted overhead: an offload costs the part of its two transfers that
    the compute inside its gap cannot hide; a recomputation costs the chain its
    lowering runs (greedy.py: the curve it plans against is the lowered
    program's). Exact placement is checked after; fragmentation tightens the
    target.
    ``plan_memory`` then times the copies and turns recomputations into
    offloads where the copy stream has room left (transfers.py).
    """

    def __init__(self, recompute=True, offload=True, name="auto", copies_free=False, knobs=Knobs(),
                 copy_windows=False):
        self.recompute, self.offload, self.name, self.knobs = recompute, offload, name, knobs
        self.copies_free = copies_free      # rank offloads as if copies took nothing from compute
        self.copy_windows = copy_windows    # the copy stream's room by direction (Greedy)

    @property
    def hybrid(self) -> bool:
        """Free to choose between offloading and recomputing."""
        return self.offload and self.recompute

    def evictions(self, facts, limit, cost):
        return self.choose(facts, limit, cost, {}, {})[0]

    def choose(self, facts, limit, cost, options, algos):
        """(evictions, algorithms) meeting ``limit``: algorithms start at ``algos`` (the fastest)
        and are traded for smaller workspaces where that costs less than evicting."""
        return self.chooser(facts, cost, options, algos)(limit)

    def chooser(self, facts, cost, options, algos):
        """``choose`` for one schedule at any number of limits: a function limit -> (evictions,
        algorithms). The greedy's decisions do not depend on the limit (it only says when to stop),
        so one run of it, continued as lower limits are asked for, answers every limit."""
        return Greedy(facts, cost, self.recompute, self.offload, options, algos,
                      self.copies_free, self.knobs, self.copy_windows).greedy


class Greedy:
    """Every gap of every arena tensor, with what evicting it frees and costs, and the greedy's state.

    The copy stream's room: by default the copies of one iteration may take ``knobs.copy_capacity``
    of its compute time, in any order. With ``copy_windows`` the stream is a queue in each direction
    instead, as the copy timing runs it (transfers.offload_recomputations reads the forward the
    same way): an offload taken in the forward and restored in the backward fits where its copy
    out fits the forward's compute after it, beside the copies out released from then on, and its
    prefetch fits the backward's compute before it is due, beside the prefetches due by then.
    """

    def __init__(self, facts, cost, allow_recompute, allow_offload, options=None, algos=None,
                 copies_free=False, knobs=Knobs(), copy_windows=False):
        schedule, touch = facts.schedule, facts.touch
        self.schedule, self.touch, self.cost, self.knobs = schedule, touch, cost, knobs
        self.options, self.algos = options or {}, dict(algos or {})
        steps = self.steps = schedule.steps
        self.secs = np.array([cost.step_seconds(schedule, s) for s in steps])
        self.cum = np.concatenate([[0.0], np.cumsum(self.secs)])
        n = len(steps)
        tensors = schedule.tensors
        self.keep = facts.keep
        ids = np.fromiter(touch, np.int64, len(touch))
        first = np.fromiter((ts[0] for ts in touch.values()), np.int64, len(touch))
        last = np.fromiter(map(facts.last_use, touch), np.int64, len(touch))
        size = schedule.tensor_bytes[ids]
        diff = np.zeros(n + 2, np.int64)
        np.add.at(diff, first, size)
        np.subtract.at(diff, last + 1, size)
        self.curve = np.cumsum(diff[:n])            # what each step itself holds
        pre = np.zeros(n + 2, np.int64)             # what is on the device before its restores
        np.add.at(pre, first + 1, size)
        np.subtract.at(pre, last + 1, size)
        for i, a in self.algos.items():           # the chosen algorithms' workspaces, not the defaults'
            st = steps[i]
            self.curve[i] += aligned(a.workspace) - (aligned(tensors[st.ws].nbytes) if st.ws is not None else 0)
        self.producer, self.writes = facts.producer, facts.writes
        self.nbytes = schedule.tensor_bytes.tolist()
        last_forward = facts.last_forward
        rows, off_cost, xfer, rc_cost = [], [], [], []
        # what the two copies take from compute even when the gap hides them
        shared = 0.0 if copies_free else 2 * (1.0 - cost.copy_overlap)
        cum, sizes = self.cum.tolist(), self.nbytes   # (faster one by one than arrays)
        for t, ts in touch.ordered():
            nb = sizes[t]
            for g in range(len(ts) - 1):
                a, b = ts[g], ts[g + 1]
                if b - a < 2:
                    continue
                x = cost.transfer_seconds(tensors[t].nbytes) if allow_offload else np.inf
                rc = (recompute_seconds(t, b, touch, self.producer, self.secs, tensors)
                      if allow_recompute and b > last_forward and t in self.producer else np.inf)
                if math.isinf(x) and math.isinf(rc):
                    continue
                rows.append((t, g, a, b, nb))
                # the copy stream is shared: even a transfer that its gap could hide may delay others
                off_cost.append(max(0.0, 2 * x - (cum[b] - cum[a + 1])) + (knobs.copy_bias + shared) * x)
                xfer.append(2 * x)
                rc_cost.append(rc)
        self.rows = rows
        self._row = {(r[0], r[1]): k for k, r in enumerate(rows)}
        self.A = np.array([r[2] for r in rows], np.int64)
        self.B = np.array([r[3] for r in rows], np.int64)
        self.size = np.array([r[4] for r in rows], np.float64)
        self.off_cost, self.xfer, self.rc_cost = np.array(off_cost), np.array(xfer), np.array(rc_cost)
        self.charged = knobs.copy_bias + shared     # of a copy's time, charged even where it is hidden
        self.taken = np.zeros(len(rows), bool)
        self.timed = {}                             # row -> (first, last, Evict) of each timed offload
        self.leads = {}                             # (tensor, gap) -> the lead of its timed offload
        if knobs.timed_offloads:
            # where a timed offload's copy out may start: beside the touch that opens its gap where
            # that touch only reads the tensor (Evict.early), else after it
            self.early = np.array([facts.only_reads(r[0], r[2]) for r in rows], bool)
            self.out_start = self.cum[np.where(self.early, self.A, self.A + 1)] if rows else np.zeros(0)
        self.copy_capacity = knobs.copy_capacity * self.cum[-1]   # what copies one iteration hides
        self.copy_used = 0.0
        self.last_forward, self.copy_windows = last_forward, copy_windows
        # out_room[i]: the forward's compute after step i, less the copies out released at i or
        # later; in_room[j]: the backward's compute before step j, less the prefetches due by j
        at = np.arange(n)
        self.out_room = np.where(at <= last_forward, self.cum[last_forward + 1] - self.cum[at + 1], np.inf)
        self.in_room = np.where(at > last_forward, self.cum[at] - self.cum[last_forward + 1], np.inf)
        self._least_room()
        # the greedy's state: the curves as decided so far, the algorithms then, each tensor's
        # evicted gaps, each step's restore chain (its peak above ``pre``, its seconds, the tensors
        # its walk asked about, the steps it recomputes), and each decision with the peak before it
        self.step_live = self.curve.astype(np.float64)
        self.pre = np.cumsum(pre[:n]).astype(np.float64)
        self.chain = np.zeros(n)
        self.chain_secs = np.zeros(n)
        self.evicted = defaultdict(dict)            # tensor -> {gap: kind}
        self.asked = defaultdict(set)               # tensor -> steps whose chain walk asked about it
        self.runs = defaultdict(set)                # schedule step -> steps whose chain recomputes it
        self.walked = {}                            # step -> (asked, recomputed) of its chain
        self.trials = TrialWalks()                  # the chains candidates' trials walked, while still valid
        self.current = dict(self.algos)
        # with nothing evicted every value a step reads is on the device: no step has a chain yet
        self.live = self.step_live.copy()
        self.peaks, self.decisions, self.stuck = [], [], False

    # -- the lowering's state at a step, from the decisions -------------------------------------
    def present(self, u, c) -> bool:
        """Whether ``u`` is on the device when step ``c``'s restores begin (after its prefetches)."""
        ts = self.touch[u]
        if c <= ts[0] or (c > ts[-1] and u not in self.keep):
            return False
        k = bisect.bisect_left(ts, c)
        if k == len(ts):
            return True                             # kept to the end
        kind = self.evicted[u].get(k - 1) if u in self.evicted else None
        if kind is None or (ts[k] == c and kind == "offload"):
            return True
        lead = self.leads.get((u, k - 1)) if kind == "offload" else None
        return lead is not None and c >= ts[k] - lead    # prefetched ``lead`` steps early

    def on_host(self, u, c) -> bool:
        """Whether the host store holds an up-to-date copy of ``u`` before step ``c``."""
        gaps = self.evicted.get(u)
        if not gaps:
            return False
        ts = self.touch[u]
        a = max((ts[g] for g, kind in gaps.items() if kind == "offload" and ts[g] < c), default=None)
        if a is None:
            return False
        w = self.writes.get(u, ())
        i = bisect.bisect_right(w, a)
        return i == len(w) or w[i] >= c

    def walk(self, c):
        """(peak bytes above ``pre[c]``, seconds it delays the step, tensors asked about, steps
        recomputed) of the chain that the lowering runs before step ``c``; (inf, inf, ...) where it
        cannot restore."""
        s = self.steps[c]
        touched = self.touch.by_step[c]
        asked = set(touched)
        missing = [t for t in touched if not self.present(t, c) and t not in s.writes and t != s.ws]
        if not missing:
            return 0.0, 0.0, asked, ()
        needed = set(touched)

        def present(u):
            asked.add(u)
            return self.present(u, c)

        def on_host(u):
            asked.add(u)
            return self.on_host(u, c)

        def droppable(u):
            return u not in needed

        try:
            order = restore_order(missing, needed, present, on_host, self.producer, self.schedule.tensors,
                                  droppable)
        except ValueError:
            return math.inf, math.inf, asked, ()
        tensors, algos = self.schedule.tensors, self.current
        peak, secs = restore_footprint(order, present, droppable, self.nbytes,
                                       lambda st: aligned(workspace_bytes(st, algos, tensors)), self.secs)
        # a chain's prefetch is issued just before the chain: the step waits for all of it
        secs += self.knobs.chain_copy_share * sum(self.cost.transfer_seconds(tensors[w].nbytes)
                                                  for k, w in order if k == "prefetch")
        return float(peak), secs, asked, tuple({w.index for k, w in order if k != "prefetch"})

    def _rewalk(self, c):
        """Walk step ``c``'s chain again and index what it depends on."""
        self._index(c, self.walk(c))

    def _index(self, c, walk):
        """Take ``walk`` as step ``c``'s chain and index what it depends on."""
        peak, secs, asked, runs = walk
        old = self.walked.get(c)
        if old is not None:
            for u in old[0]:
                self.asked[u].discard(c)
            for i in old[1]:
                self.runs[i].discard(c)
        if not runs and len(asked) == len(self.touch.by_step[c]):
            self.walked.pop(c, None)                # nothing to index beyond what it touches
            asked = ()
        else:
            self.walked[c] = (asked, runs)
        for u in asked:
            self.asked[u].add(c)
        for i in runs:
            self.runs[i].add(c)
        self.chain[c], self.chain_secs[c] = peak, secs

    # -- the greedy -------------------------------------------------------------------------------
    def _costs(self, rows, s=None):
        """(cost, is_offload) of ``rows`` (a mask or indices), given the copy time already committed;
        with ``s``, each offload timed to free the peak at step ``s`` (:meth:`_timed`)."""
        off, rc = self._offload_costs(rows, s), self.rc_cost[rows]
        return np.minimum(off, rc), off <= rc

    def _offload_costs(self, rows, s=None):
        """What offloading ``rows`` costs (:meth:`_costs`)."""
        off = self.off_cost[rows] if s is None or not self.knobs.timed_offloads else self._timed(rows, s)
        return np.where(self._over(rows), self.xfer[rows], off)   # beyond capacity a copy is exposed

    def _timed(self, rows, s):
        """The seconds offloading ``rows`` (indices) costs when the bytes must be off the device at
        step ``s``: the copy out can only overlap the steps of its gap before ``s`` (the buffer is
        held while it runs) and the prefetch only those after ``s`` (the buffer is back while it
        runs), so what they do not hide is exposed. A tensor whose host copy is up to date is
        dropped without a copy out (the lowering copies it once)."""
        a, b, x = self.A[rows], self.B[rows], self.xfer[rows] / 2
        cum = self.cum
        out = np.maximum(0.0, x - (cum[s] - self.out_start[rows]))
        for j in np.flatnonzero(out):
            if self.rows[rows[j]][0] in self.evicted and self._copied(rows[j]):
                out[j] = 0.0
        exposed = out + np.maximum(0.0, x - (cum[b] - cum[s + 1]))
        return np.where(np.isinf(x), np.inf, exposed + self.charged * np.where(np.isinf(x), 0.0, x))

    def _freed(self, k, kind, s):
        """(first, last) schedule step where evicting row ``k`` by ``kind`` for the peak at step ``s``
        frees its bytes, and the Evict: a timed offload holds its buffer until its copy out is done
        (or ``s`` comes) and prefetches it as early as hides the copy back (or right after ``s``)."""
        t, g, a, b, size = self.rows[k]
        if kind != "offload" or not self.knobs.timed_offloads:
            return a + 1, b - 1, Evict(kind)
        x, cum = self.xfer[k] / 2, self.cum
        hold = 0 if self._copied(k) else min(
            max(int(np.searchsorted(cum, self.out_start[k] + x, "left")) - (a + 1), 0), s - a - 1)
        lead = min(b - (int(np.searchsorted(cum, cum[b] - x, "right")) - 1), b - s - 1)
        return a + 1 + hold, b - lead - 1, Evict("offload", delay=hold, lead=lead, early=bool(self.early[k]))

    def _drop_copied(self, t, a):
        """``t`` was offloaded from step ``a``: its later timed offloads whose host copy is now up
        to date hold their buffers no longer (the lowering drops them as their gaps open)."""
        for k2, (lo, hi, ev) in list(self.timed.items()):
            t2, g2, a2, b2, size = self.rows[k2]
            if t2 == t and a2 > a and ev.delay and self._copied(k2):
                self.step_live[a2 + 1:lo] -= size
                self.pre[a2 + 1:lo] -= size
                self.timed[k2] = (a2 + 1, hi, Evict("offload", delay=0, lead=ev.lead, early=ev.early))
                self._relive(a2 + 1, lo)

    def _copied(self, k) -> bool:
        """Whether row ``k``'s tensor has an up-to-date host copy when its gap opens: its offload
        only drops it, with no copy out to hold its buffer for."""
        return self.on_host(self.rows[k][0], self.rows[k][2] + 1)

    def _widen(self, s):
        """(seconds per byte, row, "widen", None, freed) of the cheapest timed offload that holds its
        buffer at step ``s`` (its copy out still running, or its prefetch already issued) timed
        again to free it there too: its hold or lead shortened, what that exposes charged. None
        where no offload holds a buffer at ``s``."""
        best = None
        for k, (lo, hi, ev) in self.timed.items():
            a, b = self.A[k], self.B[k]
            if not (a < s < lo or hi < s < b):
                continue
            freed = self._freed(k, "offload", s)
            hold, lead = min(ev.delay, freed[2].delay), min(ev.lead, freed[2].lead)
            freed = (a + 1 + hold, b - lead - 1, Evict("offload", delay=hold, lead=lead, early=ev.early))
            r = (self._exposed(k, hold, lead) - self._exposed(k, ev.delay, ev.lead) + 1e-9) / self.size[k]
            if best is None or r < best[0]:
                best = (r, k, "widen", None, freed)
        return best

    def _exposed(self, k, hold, lead):
        """The copy time of row ``k``'s offload that a hold of ``hold`` and a lead of ``lead`` steps
        leave exposed."""
        a, b, x, cum = self.A[k], self.B[k], self.xfer[k] / 2, self.cum
        return (max(0.0, x - (cum[a + 1 + hold] - self.out_start[k]))
                + max(0.0, x - (cum[b] - cum[b - lead])))

    def _over(self, rows):
        """Whether the copy stream has no room left for the copies of ``rows`` (indices)."""
        xfer = self.xfer[rows]
        over = self.copy_used + xfer > self.copy_capacity
        if not self.copy_windows:
            return over
        a, b, x = self.A[rows], self.B[rows], xfer / 2
        across = (a <= self.last_forward) & (b > self.last_forward)   # out in the forward, back in the backward
        room = (self.out_least[a] >= x) & (self.in_least[b] >= x)
        return np.where(across, ~room, over)

    def _least_room(self):
        """The least room of every suffix of the forward (copies out) and prefix of the backward (prefetches)."""
        self.out_least = np.minimum.accumulate(self.out_room)
        self.in_least = np.minimum.accumulate(self.in_room[::-1])[::-1]

    def greedy(self, limit):
        """(evictions {(t, gap): Evict}, algorithms) whose lowering stays within ``limit``, or
        (None, None). Evicts greedily at the peak; the decisions are recorded, so a higher limit
        than one asked before is answered by a prefix of them and a lower one by continuing from
        where the last stopped."""
        peaks, steps = self.peaks, self.decisions
        k = next((i for i, p in enumerate(peaks) if p <= limit), None)
        while k is None:
            s = int(np.argmax(self.live))
            peak = self.live[s]
            if peak <= limit:
                k = len(steps)
                break
            decision = None if self.stuck else self._decide(s, peak)
            if decision is None:
                self.stuck = True
                break
            peaks.append(peak)
            steps.append(decision)
        if k is None:
            return None, None
        chosen, algos = {}, dict(self.algos)
        for d in steps[:k]:
            if d[0] == "algo":
                algos[d[1]] = d[2]
            else:
                chosen[d[1]] = d[2]
        return chosen, algos

    def _decide(self, s, peak):
        """Take the cheapest way to lower the curve at its peak, step ``s``: an eviction or a smaller
        workspace whose lowering lifts no step to the peak. The decision, or None if none is left.

        Candidates are ranked by their estimated seconds per byte; the first few that fit are
        costed exactly (the chains their lowering changes, walked again) and the cheapest of those
        is taken: a recomputation whose chain must restore inputs dropped since is dearer than
        its first estimate, and the estimate is kept for the next decisions."""
        idle = np.flatnonzero((self.A < s) & (self.B > s) & ~self.taken)   # the rows that can lower it
        if len(idle):
            cost, is_off = self._costs(idle, s)
            ratio = (cost + 1e-9) / self.size[idle]
        else:
            ratio = is_off = np.array([])
        swap = self._cheaper_algorithm(s) if self.step_live[s] >= peak else None
        best, exact = None, 0
        for j in _cheapest_first(ratio):
            if best is not None and (ratio[j] >= best[0] or exact >= self.knobs.exact_candidates):
                break
            if swap is not None and swap[0] <= ratio[j]:
                break
            k = int(idle[j])
            t = self.rows[k][0]
            if s in self.asked.get(t, ()):
                continue                            # the chain at s would restore it: no gain there
            fits = False
            for kind in ("offload", "recompute"):
                if (self.xfer[k] if kind == "offload" else self.rc_cost[k]) == math.inf:
                    continue
                base = float(self._offload_costs([k], s)[0]) if kind == "offload" else 0.0
                freed = self._freed(k, kind, s)
                trial = self._trial(k, kind, peak, freed)
                if trial is None:
                    continue
                fits = True
                seconds = base + trial[0]
                if kind == "recompute":
                    self.rc_cost[k] = trial[0]
                r = (seconds + 1e-9) / self.size[k]
                if best is None or r < best[0]:
                    best = (r, k, kind, trial, freed)
            exact += 1
            if not fits:
                self.taken[k] = True                # either way lifts a step to the peak: never
        widen = self._widen(s)
        if widen is not None and (best is None or widen[0] < best[0]):
            best = widen
        if swap is not None and (best is None or swap[0] <= best[0]):
            _, freed, algo = swap
            self.current[s] = algo
            self.trials.changed_step(s)
            self.step_live[s] -= freed
            for c in list(self.runs.get(s, ())):
                self._rewalk(c)
                self._relive(c, c + 1)
            self._relive(s, s + 1)
            return ("algo", s, algo)
        if best is None:
            return self._convert(s, peak)
        _, k, kind, trial, freed = best
        if kind == "widen":
            self._retime(k, freed)
        else:
            self._commit(k, kind, trial[1], freed)
        return ("evict", (self.rows[k][0], self.rows[k][1]), freed[2])

    def _convert(self, s, peak):
        """Where no gap left can lower the peak at step ``s``, its restore chain may: a value that
        chain recomputes, because an earlier decision recomputes it, is offloaded instead (the chain
        then prefetches it rather than recomputing it from inputs it must restore and hold too). The
        decision taken earlier could not know which chains later decisions would lengthen: without
        this move the greedy ends at the first peak where its earlier choices hold it up (ResNet-50
        b256 at 15% on a100-40gb: a BatchNorm's backward in layer2, its chain holding 2.3 GiB of
        recomputed layer1 outputs). The conversion whose trial lowers the peak at ``s`` for the fewest
        seconds per byte is taken; each row converts at most once. The decision, or None."""
        best = None
        for t in sorted(u for u, gaps in self.evicted.items() if s in self.asked.get(u, ())
                        and "recompute" in gaps.values()):
            for g, kind in sorted(self.evicted[t].items()):
                if kind != "recompute":
                    continue
                k = self._row.get((t, g))
                if k is None or math.isinf(self.xfer[k]):
                    continue
                trial = self._trial_convert(k, s, peak)
                if trial is not None:
                    r = (trial[0] + 1e-9) / trial[1]
                    if best is None or r < best[0]:
                        best = (r, k, trial[2])
        if best is None:
            return None
        _, k, walks = best
        t, g, a, b, size = self.rows[k]
        self.evicted[t][g] = "offload"
        self.trials.changed_tensor(t)
        self._add_copy(k)
        self.pre[b] += size               # a prefetched value is there before the step's restores
        for c, walk in walks.items():
            self._index(c, walk)
        self._relive(b, b + 1)
        for c in walks:
            self._relive(c, c + 1)
        return ("evict", (t, g), Evict("offload"))

    def _trial_convert(self, k, s, peak):
        """(the seconds it adds, the bytes it lowers step ``s`` by, the chains it changes walked) of
        offloading row ``k`` instead of recomputing it, or None where that does not lower the peak at
        ``s`` or lifts another step to it."""
        t, g, a, b, size = self.rows[k]
        again = {c for c in self.asked.get(t, ()) if c > a} | {b}
        walks = self._walks_as(k, "offload", again, self.walk)
        added = (self.xfer[k] if self._over([k])[0] else self.off_cost[k]) - self.rc_cost[k]
        lowered = 0.0
        for c, (chain, secs, *_) in walks.items():
            value = max(self.step_live[c], self.pre[c] + (size if c == b else 0) + chain)
            if c == s:
                lowered = peak - value
            elif value >= peak and value > self.live[c]:
                return None
            added += secs - self.chain_secs[c]
        if s not in walks or lowered <= 0:
            return None
        return max(added, 0.0), lowered, walks

    def _relive(self, lo, hi):
        self.live[lo:hi] = np.maximum(self.step_live[lo:hi], self.pre[lo:hi] + self.chain[lo:hi])

    def _trial(self, k, kind, peak, freed):
        """(the seconds the chains add, their new walks) of evicting row ``k`` by ``kind``, its bytes
        off the device over the steps ``freed`` (:meth:`_freed`), or None where a chain it changes
        would then hold the peak or more."""
        t, g, a, b, size = self.rows[k]
        again = {c for c in self.asked.get(t, ()) if c > a}
        if kind == "recompute":
            again.add(b)
        lead = freed[2].lead or None
        walks = self._walks_as(k, kind, again, lambda c: self.trials.walk(self, c, k, kind, lead), lead)
        lo, hi = freed[0], freed[1]
        added = 0.0
        for c, (chain, secs, *_) in walks.items():
            inside = size if lo <= c <= hi else 0
            drop = size if inside or (c == b and kind == "recompute") else 0
            value = max(self.step_live[c] - inside, self.pre[c] - drop + chain)
            if value >= peak and value > self.live[c]:
                return None
            added += secs - self.chain_secs[c]
        return added, walks

    def _walks_as(self, k, kind, steps, walk, lead=None):
        """{c: walk(c)} for ``steps``, the chains walked as if row ``k``'s gap were evicted by ``kind``
        (an offload prefetched ``lead`` steps early; the decisions as they are again after)."""
        t, g = self.rows[k][0], self.rows[k][1]
        was = self.evicted[t].get(g)
        self.evicted[t][g] = kind
        if lead:
            self.leads[(t, g)] = lead
        walks = {c: walk(c) for c in steps}
        if lead:
            del self.leads[(t, g)]
        if was is not None:
            self.evicted[t][g] = was
        else:
            del self.evicted[t][g]
            if not self.evicted[t]:
                del self.evicted[t]
        return walks

    def _commit(self, k, kind, walks, freed):
        """Evict row ``k`` by ``kind`` over the steps ``freed``, its changed chains walked already
        (``walks``)."""
        t, g, a, b, size = self.rows[k]
        lo, hi = freed[0], freed[1]
        self.evicted[t][g] = kind
        self.trials.changed_tensor(t)
        self.taken[k] = True
        if kind == "offload":
            self._add_copy(k)
            if self.knobs.timed_offloads:
                self.timed[k] = freed
                if freed[2].lead:
                    self.leads[(t, g)] = freed[2].lead
                self._drop_copied(t, a)
        self.step_live[lo:hi + 1] -= size
        self.pre[lo:hi + 1] -= size
        if kind == "recompute":
            self.pre[b] -= size
        for c, walk in walks.items():
            self._index(c, walk)
        self._relive(a + 1, b + 1)
        for c in walks:
            self._relive(c, c + 1)

    def _retime(self, k, freed):
        """Time row ``k``'s offload again to free its bytes over ``freed`` (a wider span: a shorter
        hold or lead)."""
        t, g, a, b, size = self.rows[k]
        old = self.timed[k]
        for lo, hi in ((freed[0], old[0] - 1), (old[1] + 1, freed[1])):
            self.step_live[lo:hi + 1] -= size
            self.pre[lo:hi + 1] -= size
        self.timed[k] = freed
        if freed[2].lead != old[2].lead:            # prefetched later: the chains before see it gone
            if freed[2].lead:
                self.leads[(t, g)] = freed[2].lead
            else:
                del self.leads[(t, g)]
            self.trials.changed_tensor(t)
            for c in sorted(self.asked.get(t, ())):
                if b - old[2].lead <= c < b - freed[2].lead:
                    self._rewalk(c)
                    self._relive(c, c + 1)
        self._relive(a + 1, b)

    def _add_copy(self, k):
        """Take row ``k``'s two copies from the copy stream's room."""
        a, b = self.rows[k][2], self.rows[k][3]
        self.copy_used += self.xfer[k]
        if self.copy_windows and a <= self.last_forward < b:
            self.out_room[:a + 1] -= self.xfer[k] / 2
            self.in_room[b:] -= self.xfer[k] / 2
            self._least_room()

    def _cheaper_algorithm(self, s):
        """(seconds lost per byte freed, bytes freed, Algo) of the best smaller-workspace algorithm at step s."""
        opts = self.options.get(s)
        if not opts:
            return None
        cur = self.current.get(s, opts[0][1])
        t_cur = next(t for t, a in opts if a == cur)
        best = None
        for t, a in opts:
            freed = aligned(cur.workspace) - aligned(a.workspace)
            if freed > 0:
                r = (max(t - t_cur, 0.0) + 1e-9) / freed
                if best is None or r < best[0]:
                    best = (r, freed, a)
        return best

    def predicted_curve(self) -> np.ndarray:
        """The most arena bytes held during each schedule step, as the decisions so far lower."""
        return self.live.astype(np.int64)

    def all(self):
        """Every gap evicted, each by its cheaper way (offload where it cannot be recomputed)."""
        everything = np.ones(len(self.rows), bool)
        _, is_off = self._costs(everything)
        return {(r[0], r[1]): Evict("offload" if o else "recompute") for r, o in zip(self.rows, is_off)}


class TrialWalks:
    """The chains a candidate's trial walks (:meth:`Greedy.walk` of step ``c`` with row ``k`` evicted
    by ``kind``), kept until something they depend on changes: a walk is a function of the answers
    to the questions it asked (whether each tensor it asked about is on the device or the host,
    from that tensor's evicted gaps) and of the algorithms of the steps it recomputes (their
    workspaces), so it stays valid until a decision evicts a gap of a tensor it asked about or
    changes the algorithm of a step it runs. The greedy costs the same few candidates at decision
    after decision, and each decision changes few of their chains: walked once each, not once per
    decision (on deep networks, whose chains are long, the walks were nearly all of the greedy)."""

    def __init__(self):
        self.kept = {}                      # (c, k, kind, lead) -> the walk
        self.by_tensor = defaultdict(set)   # tensor -> keys of the walks that asked about it
        self.by_step = defaultdict(set)     # schedule step -> keys of the walks that recompute it

    def walk(self, greedy, c, k, kind, lead=None):
        """``greedy.walk(c)`` (the trial's eviction of row ``k`` by ``kind``, prefetched ``lead``
        steps early, in place), or the walk kept from before, still valid."""
        key = (c, k, kind, lead)
        out = self.kept.get(key)
        if out is None:
            out = self.kept[key] = greedy.walk(c)
            for u in out[2]:
                self.by_tensor[u].add(key)
            for i in out[3]:
                self.by_step[i].add(key)
        return out

    def changed_tensor(self, t):
        """A gap of ``t`` was evicted: the walks that asked about it are walked again when asked for.
        (A key indexed under another tensor too may be dropped again later, after it was walked
        anew: that walk is then only repeated, never kept stale.)"""
        for key in self.by_tensor.pop(t, ()):
            self.kept.pop(key, None)

    def changed_step(self, s):
        """Step ``s`` runs another algorithm: the walks that recompute it are walked again."""
        for key in self.by_step.pop(s, ()):
            self.kept.pop(key, None)


def _cheapest_first(ratio, head=16):
    """Indices of ``ratio`` by increasing (value, index): the few smallest sorted first, the rest
    after (the first is nearly always taken; sorting every candidate for each decision would
    dominate). Equal ratios are common (a network's many tensors of one size and cost), so the head
    is every index whose value is at most the head-th smallest one, taken in index order: which of
    equal values ``argpartition`` returns depends on NumPy's SIMD dispatch, and so on the CPU."""
    n = len(ratio)
    if n <= head:
        yield from np.argsort(ratio, kind="stable").tolist()
        return
    cut = np.partition(ratio, head - 1)[head - 1]      # a value: the same on every machine
    first = ratio <= cut
    top = np.flatnonzero(first)
    yield from top[np.argsort(ratio[top], kind="stable")].tolist()
    others = np.flatnonzero(~first)
    yield from others[np.argsort(ratio[others], kind="stable")].tolist()
