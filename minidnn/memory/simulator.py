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
"""
from __future__ import annotations

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
    diff = np.zeros(len(program.steps) + 1, np.int64)
    np.add.at(diff, starts, sizes)
    np.subtract.at(diff, ends + 1, sizes)
    return np.cumsum(diff[:-1])


def step_costs(program, schedule, cost, algos=None) -> list:
    """Compute-stream seconds of each program step (0 for copies), with the chosen algorithms."""
    algos, steps = algos or {}, schedule.steps
    return [cost.step_seconds(schedule, steps[o], algos.get(o)) if o >= 0 else 0.0 for o in program.origin]


def simulate(program, schedule, cost, costs=None, algos=None, comm=None) -> Simulation:
    """The predicted timeline of ``program``. ``comm``: the reduction cost of data-parallel ranks
    (``comm.seconds(nbytes)`` and ``comm.shares_host_link``; see ``memory.dataparallel``), needed
    where the program has ``reduce`` steps."""
    costs = costs if costs is not None else step_costs(program, schedule, cost, algos)
    waits: dict[int, list] = {}
    for r in program.residencies:
        if r.wait_offload is not None:
            waits.setdefault(r.end, []).append(r.wait_offload)
    shared = 1.0 - cost.copy_overlap     # the fraction of a copy's time that compute beside it loses
    t_c = t_x = stall = busy = recompute = compute = 0.0
    t_m = comm_busy = comm_wait = 0.0        # the communication stream
    one_link = comm is not None and comm.shares_host_link
    reduced: dict[int, float] = {}           # gradient -> the end of its reduction
    ready: dict[int, float] = {}
    done: dict[int, float] = {}
    off_b = pre_b = 0
    starts, ends, streams = [], [], []
    for i, s in enumerate(program.steps):
        kind = s.kind
        if kind == "offload" or kind == "prefetch":
            t = s.reads[0] if kind == "offload" else s.writes[0]
            n = program.tensors[t].nbytes
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
                pre_b += n
            starts.append(begin), ends.append(t_x), streams.append("copy")
            for j in waits.get(i, ()):    # a synchronous offload: compute waits for it here
                if done[j] > t_c:
                    stall += done[j] - t_c
                    t_c = done[j]
            continue
        if kind == "reduce":
            d = comm.seconds(sum(program.tensors[t].nbytes for t in s.updates))
            begin = max(t_c, t_m, t_x) if one_link else max(t_c, t_m)
            t_m = begin + d
            comm_busy += d
            lost = shared * d                 # a communication thread takes from compute as a copy does
            t_c += lost
            stall += lost
            for t in s.updates:
                reduced[t] = t_m
            starts.append(begin), ends.append(t_m), streams.append("comm")
            continue
        # the latest arrival of what it touches (ready.get(t, 0.0) each); 0.0 before any prefetch
        need = max(map(ready.get, s.touched, repeat(0.0)), default=0.0) if ready else 0.0
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
        for j in waits.get(i, ()):
            if done[j] > t_c:
                stall += done[j] - t_c
                t_c = done[j]
        ends.append(t_c), streams.append("compute")
    return Simulation(max(t_c, t_x, t_m), compute, recompute, busy, stall, off_b, pre_b, starts, ends, streams,
                      memory_curve(program).tolist(), costs, comm_busy, comm_wait)
