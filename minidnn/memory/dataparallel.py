"""Predicted data-parallel training: one rank's plan, its gradient reductions, N ranks' step time.

Every rank runs the same plan on its slice of the global mini-batch, so one
rank's timeline is the step's. Its program gains a ``reduce`` step per
gradient bucket (:func:`with_reductions`), right after the step that
writes the bucket's last gradient; the simulator runs them on a third stream
priced by the system's interconnect (a ring all-reduce, see
``profiles.Interconnect``), and each optimizer update waits for its own
bucket's reduction only. Where that link is the host link the offloads use,
copies and reductions queue on it together.

Scaling is weak: each rank keeps its batch (the per-GPU batch), so N ranks
train a global batch N times larger. The *speed-up* is the images per second
of N ranks over those of one device at the per-rank batch, N * t1 / tN, and
the *efficiency* the speed-up over N. Nothing runs but the planner and the
simulator.

The budget is per device and holds as planned: a bucket is the gradients'
own storage in the persistent region and a reduction runs in place on it
(NCCL and ``MPI_IN_PLACE``), so an in-flight reduction holds no buffer of its
own; :attr:`Prediction.peak_bytes` is measured on the program with its
reductions all the same.
"""
from __future__ import annotations

from collections import defaultdict
from copy import copy as shallow
from dataclasses import dataclass

from ..schedule import Step
from .costmodel import ProfileCost
from .profiles import Interconnect, get_system
from .program import Program, Residency
from .simulator import simulate
from .subbatch import SubBatchPlan


@dataclass(frozen=True)
class Communication:
    """What the simulator needs of the communication stream: a ring all-reduce over ``ranks``
    on ``link`` (None: one device, nothing to reduce)."""

    link: Interconnect
    ranks: int

    def seconds(self, nbytes) -> float:
        return self.link.allreduce_seconds(nbytes, self.ranks) if self.link is not None else 0.0

    @property
    def shares_host_link(self) -> bool:
        return self.link is not None and self.link.shares_host_link


@dataclass
class Prediction:
    """N ranks running one plan: the single-device timeline and the data-parallel one."""

    ranks: int
    link: Interconnect
    single: object           # Simulation of one device (the plan's own prediction)
    simulation: object       # Simulation of one rank of ``ranks``, reductions included
    program: object          # the program with its reduce steps (for the last sub-batch where split)
    buckets: list            # gradient tensor ids per bucket, in reduction order
    bucket_bytes: list
    peak_bytes: int          # persistent + the arena of ``program``
    budget: int = None
    extra_seconds: float = 0.0   # sub-batches before the last, and the update, in both timelines

    @property
    def seconds(self) -> float:
        """Predicted time of one training step of ``ranks`` ranks."""
        return self.simulation.seconds + self.extra_seconds

    @property
    def single_seconds(self) -> float:
        return self.single.seconds + self.extra_seconds

    @property
    def speedup(self) -> float:
        return self.ranks * self.single_seconds / self.seconds

    @property
    def efficiency(self) -> float:
        return self.speedup / self.ranks

    @property
    def exposed_seconds(self) -> float:
        """Time the compute stream waits for reductions."""
        return self.simulation.comm_wait_seconds

    def summary(self) -> str:
        link = f"{self.link.name} ({self.link.description})" if self.link is not None else "none"
        gb = sum(self.bucket_bytes) / 1e6
        return "\n".join([
            f"data-parallel: {self.ranks} ranks over {link}; {len(self.buckets)} gradient buckets, {gb:.1f} MB",
            f"  one device         {self.single_seconds * 1e3:10.2f} ms",
            f"  {self.ranks} ranks {' ' * max(0, 11 - len(str(self.ranks)))}{self.seconds * 1e3:10.2f} ms; "
            f"communication {self.simulation.comm_seconds * 1e3:.2f} ms, exposed "
            f"{self.exposed_seconds * 1e3:.2f} ms",
            f"  speed-up {self.speedup:.2f}x, scaling efficiency {self.efficiency * 100:.1f}% "
            f"(weak scaling: each rank keeps its batch)"])


def predict(plan, buckets, system, ranks, cost=None) -> Prediction:
    """The step time of ``ranks`` data-parallel ranks running ``plan`` (a Plan, or a SubBatchPlan
    whose last sub-batch reduces) on ``system`` (a SystemProfile or its name), with gradient
    ``buckets`` (lists of the plan's gradient tensor ids, in reduction order). ``cost``: the cost
    model the plan was made with (default: the system's device profile)."""
    system = get_system(system)
    link = system.link(ranks)
    cost = cost or ProfileCost(system.device)
    comm = Communication(link, ranks)
    extra = 0.0
    if isinstance(plan, SubBatchPlan):      # k - 1 sub-batches accumulate locally, the last reduces
        extra = (plan.k - 1) * plan.sub.simulation.seconds + plan.update.simulation.seconds
        persistent = max(plan.sub.persistent_bytes, plan.update.persistent_bytes)
        plan = plan.sub
    else:
        persistent = plan.persistent_bytes
    program = with_reductions(plan.program, plan.offsets, buckets)
    sim = simulate(program, plan.schedule, cost, algos=plan.algos, comm=comm)
    sizes = program.tensor_bytes
    arena = max((off + int(sizes[r.tensor]) for r, off in zip(program.residencies, plan.offsets)), default=0)
    nbytes = [sum(program.tensors[t].nbytes for t in b) for b in buckets]
    return Prediction(ranks, link, plan.simulation, sim, program, [list(b) for b in buckets], nbytes,
                      persistent + arena, plan.budget, extra)


def with_reductions(program, offsets, buckets, reorder=True) -> Program:
    """``program`` with a ``reduce`` step per gradient bucket (a list of gradient tensor ids;
    ``buckets`` in the order they are reduced), each right after the step that writes its last
    gradient: the communication stream's steps, for the simulator and the executor. The optimizer
    updates take the places of the updates in the order their buckets are reduced (they touch only
    their own parameter, gradient, state and scratch), so each waits for its own reduction only
    and the first ones run while later buckets are still being reduced.

    A reduction is in place on its bucket, which the persistent region holds (the gradients are
    views of it), so it adds no arena buffer: the residencies (and so ``offsets``, by residency index) are those of
    ``program``, renumbered (an update's scratch buffer moves with it; where its place in the arena
    is not free at its new step, as a buffer whose free was delayed into the updates may hold it,
    the updates keep their order: ``reorder=False``). With sub-batches, the program of the last one
    carries them (the gradients are reduced once per mini-batch)."""
    last = {}                                 # gradient -> the last step that writes or adds into it
    for s in program.steps:
        if s.kind not in ("offload", "prefetch"):
            for t in s.writes + s.updates:
                last[t] = s.index
    after = defaultdict(list)                 # program step -> the buckets reduced after it
    for k, bucket in enumerate(buckets):
        missing = [program.tensors[t].name for t in bucket if t not in last]
        if missing:
            raise ValueError(f"bucket {k}: no step of the program writes {', '.join(missing[:3])}")
        after[max(last[t] for t in bucket)].append(k)
    rank = {t: k for k, bucket in enumerate(buckets) for t in bucket}
    places = [s.index for s in program.steps if s.kind == "update"] if reorder else []
    updates = sorted(places, key=lambda i: (min((rank.get(t, len(buckets)) for t in program.steps[i].reads),
                                                default=len(buckets)), i))
    order = list(range(len(program.steps)))
    for place, i in zip(places, updates):
        order[place] = i
    steps, origin, at = [], [], [0] * len(order)   # at: old position -> new position
    moved = {}                                # an update's scratch tensor -> its new step
    for pos, i in enumerate(order):
        s = program.steps[i]
        at[pos] = len(steps)
        copy = shallow(s)
        copy.index = len(steps)
        steps.append(copy)
        origin.append(program.origin[i])
        if i != pos and s.ws is not None:
            moved[s.ws] = copy.index
        for k in after.get(i, ()):
            bucket = list(buckets[k])
            steps.append(Step(len(steps), "reduce", f"reduce bucket {k}", updates=bucket, ins=bucket,
                              outs=bucket))
            origin.append(-1)
    res = [Residency(r.tensor, moved.get(r.tensor, at[r.start]), moved.get(r.tensor, at[r.end]), r.origin,
                     None if r.wait_offload is None else at[r.wait_offload], r.delay)
           for r in program.residencies]
    if moved and _collides([k for k, r in enumerate(res) if r.tensor in moved], res, offsets, program.tensor_bytes):
        return with_reductions(program, offsets, buckets, reorder=False)
    return Program(steps, program.tensors, res, dict(program.host_slots), program.host_bytes, origin,
                   program.tensor_bytes)


def _collides(moved, residencies, offsets, nbytes) -> bool:
    """Whether a residency of ``moved`` (indices) shares bytes of the arena (``offsets``, by residency
    index) with another live at its step."""
    lo, hi = min(residencies[k].start for k in moved), max(residencies[k].end for k in moved)
    near = [j for j, r in enumerate(residencies) if r.start <= hi and r.end >= lo]
    for k in moved:
        m = residencies[k]
        a, b = offsets[k], offsets[k] + int(nbytes[m.tensor])
        for j in near:
            r = residencies[j]
            if j != k and r.start <= m.start <= r.end and offsets[j] < b and a < offsets[j] + int(nbytes[r.tensor]):
                return True
    return False
