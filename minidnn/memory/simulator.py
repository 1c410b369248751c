"""Replays a Program on its streams - compute, copy and (with ranks) communication - with a cost model.

The compute stream runs the steps in order; the copy stream runs offloads and
prefetches in the order they are issued, each starting when both the stream is
free and the compute stream has reached it. A step waits for the prefetches of
the tensors it touches; freeing an offloaded buffer waits for its offload.
Waiting time is a *stall*. The result predicts the step time and the device
memory held after each step.

With ``comm`` (data-parallel ranks), the program's ``reduce`` steps run on a
third stream in the order they are issued, each starting once the compute
stream has written its bucket's last gradient; a step that reads a gradient
(its optimizer update) waits for that gradient's reduction only (the time
waited is *exposed communication*). Where the interconnect shares the host
link (``comm.shares_host_link``), copies and reductions are one queue on that
link, in issue order: a ring step sends and receives at once, so a reduction
holds both directions of the link and a copy beside it would only slow it by
as much as it gains.

The planner replays hundreds of programs that differ from one they were lowered
from in a few decisions: a replay keeps its state at the lowering's checkpoints,
and the replay of a program lowered from another (``Program.lineage``) starts
from that one's last state it shares (:func:`simulate`).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from itertools import repeat

import numpy as np


@dataclass
class Simulation:
    seconds: float                 # predicted time of one iteration
    compute_seconds: float         # sum of compute-stream step times (incl. recomputation)
    recompute_seconds: float
    copy_seconds: float            # busy time of the copy stream
    stall_seconds: float           # compute stream waiting for copies
    offload_bytes: int
    prefetch_bytes: int
    start: list = field(default_factory=list)     # per program step, seconds
    end: list = field(default_factory=list)
    stream: list = field(default_factory=list)    # "compute" or "copy"
    memory: list = field(default_factory=list)    # arena bytes held during each step
    costs: list = field(default_factory=list)     # compute seconds of each step (0 for copies)
    comm_seconds: float = 0.0      # busy time of the communication stream
    comm_wait_seconds: float = 0.0  # compute stream waiting for reductions (exposed communication)

    @property
    def overlap(self) -> float:
        """Fraction of the copy stream's busy time hidden behind compute."""
        return 1.0 - min(self.stall_seconds, self.copy_seconds) / self.copy_seconds if self.copy_seconds else 1.0


def memory_curve(program) -> np.ndarray:
    """Arena bytes held at each step of ``program`` (placement aside)."""
    starts, ends, sizes = program.buffers
    n = len(program.steps)
    # (bincount's float64 sums are exact: a step's sum stays far below 2^53 bytes)
    diff = (np.bincount(starts, sizes, n + 1) - np.bincount(ends + 1, sizes, n + 1)).astype(np.int64)
    return np.cumsum(diff[:-1])


def step_costs(program, schedule, cost, algos=None) -> list:
    """Compute-stream seconds of each program step (0 for copies), with the chosen algorithms."""
    algos, steps = algos or {}, schedule.steps
    return [cost.step_seconds(schedule, steps[o], algos.get(o)) if o >= 0 else 0.0 for o in program.origin]


@dataclass
class _Replay:
    """What replaying a Program leaves on it (``Program.replay``) for the replays of the programs
    lowered from it (their ``lineage``): the inputs it was replayed with, where its frees waited for
    offloads (``waits``) and the compute stream's time at each step before those waits (``before``),
    when each offload ended (``done``), the result, and the replay's state at the program steps where
    the lowering kept checkpoints (a program resumed from one of them shares the steps before it)."""

    schedule: object
    cost: object
    algos: dict
    waits: dict
    before: list
    done: dict
    simulation: Simulation
    states: list          # (program step, the state before it), ascending
    table: list           # seconds by schedule step (0.0 last: a copy's origin is -1)


def _waits(program) -> dict:
    """Program step -> the offloads (program steps) whose completion a free after it waits for, in
    the residencies' order."""
    waits: dict[int, list] = {}
    for r in program.residencies:
        if r.wait_offload is not None:
            waits.setdefault(r.end, []).append(r.wait_offload)
    return waits


def _resumable(program, schedule, cost, algos, waits):
    """(the base's replay, or None where it was replayed otherwise; the latest of its states this
    replay may start from, or None).

    A program lowered from another (``Program.lineage``) has that one's first steps; replayed with
    the same costs, its state before a step q is the other's where, besides, every free before q
    that waits for an offload in one of them and not alike in the other waits for nothing: the
    offload had ended when the compute stream reached the free (the copy timing holds a buffer
    until its copy is done, so a retimed plan's frees move without waiting)."""
    lineage = program.lineage
    base = lineage.base() if lineage is not None else None
    replay = base.replay if base is not None else None
    if replay is None or replay.schedule is not schedule or replay.cost is not cost or replay.algos != algos:
        return None, None
    limit = lineage.steps
    if not replay.states or limit < replay.states[0][0]:
        return replay, None
    old, before, done = replay.waits, replay.before, replay.done
    for e in sorted({e for e in waits if e < limit} | {e for e in old if e < limit}):
        if e >= limit:
            break
        now, was = waits.get(e), old.get(e)
        if now != was and any(done[j] > before[e] for js in (now, was) if js for j in js):
            limit = e
            break
    at = bisect.bisect_right(replay.states, limit, key=lambda st: st[0]) - 1
    return replay, (replay.states[at] if at >= 0 else None)


def simulate(program, schedule, cost, costs=None, algos=None, comm=None) -> Simulation:
    """The predicted timeline of ``program``. ``comm``: the reduction cost of data-parallel ranks
    (``comm.seconds(nbytes)`` and ``comm.shares_host_link``; see ``memory.dataparallel``), needed
    where the program has ``reduce`` steps.

    Without ``costs`` and ``comm``, the replay keeps its state where the program's lowering kept
    checkpoints (``Program.replay``), and a program lowered from another (``Program.lineage``)
    starts from the latest state of that one's replay that it shares; the result is the same
    (tests/test_planning_time_replay.py)."""
    waits = _waits(program)
    algos = algos or {}
    keep = costs is None and comm is None and program.resume is not None
    base, start = _resumable(program, schedule, cost, algos, waits) if keep else (None, None)
    if keep:        # every step's seconds, by its origin (computed once for a lineage of programs)
        table = base.table if base is not None else (
            [cost.step_seconds(schedule, st, algos.get(st.index)) for st in schedule.steps] + [0.0])
    shared = 1.0 - cost.copy_overlap     # the fraction of a copy's time that compute beside it loses
    one_link = comm is not None and comm.shares_host_link
    reduced: dict[int, float] = {}           # gradient -> the end of its reduction
    if start is None:
        q = 0
        if costs is None:
            costs = list(map(table.__getitem__, program.origin)) if keep else step_costs(program, schedule, cost,
                                                                                          algos)
        t_c = t_x = stall = busy = recompute = compute = 0.0
        t_m = comm_busy = comm_wait = 0.0        # the communication stream
        off_b = pre_b = 0
        ready: dict[int, float] = {}         # tensor -> when its last prefetch arrives
        done: dict[int, float] = {}          # offload -> when it ends
        starts, ends, streams = [], [], []
        states, before = [], []
    else:
        q, state = start
        (t_c, t_x, t_m, stall, busy, recompute, compute, comm_busy, comm_wait, off_b, pre_b, ready,
         done) = state
        ready, done = dict(ready), dict(done)
        old = base.simulation
        costs = old.costs[:q] + list(map(table.__getitem__, program.origin[q:]))
        starts, ends, streams = old.start[:q], old.end[:q], old.stream[:q]
        states, before = [st for st in base.states if st[0] <= q], base.before[:q]
    marks = iter([c.steps for c in program.resume.checkpoints if c.steps > q] if keep else ())
    mark = next(marks, -1)
    steps, tensors = program.steps, program.tensors
    latest = max(ready.values(), default=0.0)   # the latest arrival of a prefetch
    for i in range(q, len(steps)):
        if i == mark:
            states.append((i, (t_c, t_x, t_m, stall, busy, recompute, compute, comm_busy, comm_wait, off_b, pre_b,
                               dict(ready), dict(done))))
            mark = next(marks, -1)
        s = steps[i]
        kind = s.kind
        if kind == "offload" or kind == "prefetch":
            t = s.reads[0] if kind == "offload" else s.writes[0]
            n = tensors[t].nbytes
            d = cost.transfer_seconds(n)
            begin = max(t_c, t_x, t_m) if one_link else max(t_c, t_x)
            t_x = begin + d
            busy += d
            lost = shared * d                 # compute slowed by a copy sharing its resources
            t_c += lost
            stall += lost
            if kind == "offload":
                done[i] = t_x
                off_b += n
            else:
                ready[t] = t_x
                latest = t_x if t_x > latest else latest
                pre_b += n
            starts.append(begin), ends.append(t_x), streams.append("copy")
            if keep:
                before.append(t_c)
            if i in waits:
                for j in waits[i]:            # a synchronous offload: compute waits for it here
                    if done[j] > t_c:
                        stall += done[j] - t_c
                        t_c = done[j]
            continue
        if kind == "reduce":
            d = comm.seconds(sum(tensors[t].nbytes for t in s.updates))
            begin = max(t_c, t_m, t_x) if one_link else max(t_c, t_m)
            t_m = begin + d
            comm_busy += d
            lost = shared * d                 # a communication thread takes from compute as a copy does
            t_c += lost
            stall += lost
            for t in s.updates:
                reduced[t] = t_m
            starts.append(begin), ends.append(t_m), streams.append("comm")
            if keep:
                before.append(t_c)
            continue
        if ready:
            if latest <= t_c:
                # every prefetch has arrived before the compute stream got here: none can hold it up
                # again (the clock only moves on), so they are let go
                ready.clear()
            else:   # the latest arrival of what it touches (ready.get(t, 0.0) each)
                need = max(map(ready.get, s.touched, repeat(0.0)), default=0.0)
                if need > t_c:
                    stall += need - t_c
                    t_c = need
        if reduced:
            need = max(map(reduced.get, s.reads, repeat(0.0)), default=0.0)
            if need > t_c:
                comm_wait += need - t_c
                t_c = need
        starts.append(t_c)
        c = costs[i]
        t_c += c
        compute += c
        if kind == "recompute":
            recompute += c
        if keep:
            before.append(t_c)
        if i in waits:
            for j in waits[i]:
                if done[j] > t_c:
                    stall += done[j] - t_c
                    t_c = done[j]
        ends.append(t_c), streams.append("compute")
    sim = Simulation(max(t_c, t_x, t_m), compute, recompute, busy, stall, off_b, pre_b, starts, ends, streams,
                     memory_curve(program).tolist(), costs, comm_busy, comm_wait)
    if keep:
        program.replay = _Replay(schedule, cost, dict(algos), waits, before, done, sim, states, table)
    return sim
