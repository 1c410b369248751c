"""The Plan: where every buffer of an iteration lives at every step, and what it costs."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..ops.loss import MeanOfLossesOp
from .config import format_bytes


@dataclass
class Plan:
    """A memory plan for one iteration, produced by a planner and carried out exactly.

    Byte figures (all include the persistent region - parameters, gradients,
    optimizer and BN state - except ``arena_bytes``):

    - ``ideal_bytes``: every tensor of the iteration resident at once;
    - ``liveness_peak_bytes``: the largest sum of bytes live at one step when
      nothing is evicted (static reuse of dead buffers only);
    - ``lower_bound_bytes``: the largest working set of a single step (its
      inputs, outputs and workspace), everything else off the device;
    - ``minimum_bytes``: the smallest budget this planner can meet;
    - ``peak_bytes``: what this plan uses = persistent + ``arena_bytes`` (the
      largest end offset of any placed buffer); the executor measures the same.

    ``program`` holds the executable steps (with offload, prefetch and
    recompute steps inserted) and the residencies, one buffer each, whose
    offsets ``offsets`` gives by residency index.

    A Plan is the whole step (``k`` = 1); split steps are planned in
    ``memory.subbatch``, and every kind has this interface: ``k``,
    ``sub_batch``, ``peak_bytes``, ``predicted_seconds``, ``budget``,
    ``summary()``, ``labels``, ``classes``, ``batch_norm_updates`` and ``run``.
    """

    schedule: object
    program: object
    offsets: list
    persistent_bytes: int
    arena_bytes: int
    ideal_bytes: int
    liveness_peak_bytes: int
    lower_bound_bytes: int = None
    minimum_bytes: int = None
    budget: int = None
    policy: str = "none"
    simulation: object = None       # predicted time and memory of this plan
    baseline: object = None         # the same for the plan with unlimited memory
    evictions: dict = None          # {(tensor, gap): Evict}
    host_bytes: int = 0
    placement: str = "single pool"
    algos: dict = None              # schedule step index -> the ops.base.Algo it runs with
    keep_within: int = 0            # the lowering's horizon for recomputed chain inputs (program.lower)
    baseline_algos: dict = None     # the unlimited plan's algorithms
    log: tuple = ()                 # the planner's search: every trial (search.Trial), in order

    @property
    def algorithm_changes(self) -> dict:
        """step label -> (fastest, chosen) for steps not running their fastest algorithm."""
        if not self.baseline_algos:
            return {}
        return {self.schedule.steps[i].label + f" ({self.schedule.steps[i].kind})": (a.name, self.algos[i].name)
                for i, a in self.baseline_algos.items() if self.algos.get(i) != a}

    k = 1                           # the step runs whole
    batch_norm_updates = 1          # a training step moves BatchNorm's running statistics once

    # -- the step it plans --------------------------------------------------------
    @property
    def sub_batch(self) -> int:
        """Samples per run of this plan (the first input's batch)."""
        return self.schedule.tensor(self.schedule.inputs[0]).spec.shape[0]

    @property
    def labels(self):
        """The Spec of a training step's labels (its second input)."""
        return self.schedule.tensor(self.schedule.inputs[1]).spec

    @property
    def classes(self) -> int:
        """How many classes the loss's input scores (the range of integer labels)."""
        node = self.schedule.graph.outputs[0].producer
        if isinstance(node.op, MeanOfLossesOp):      # a split step's losses: the first sub-batch's logits
            node = node.inputs[0].producer
        return node.inputs[0].shape[1]

    def run(self, executor, ctx, x, y=None, optimizer=None, t=0, recorder=None, txn=None):
        """Carry out the step on ``x`` (and labels ``y`` in training) with ``executor``: the loss as a float,
        or for an eval pass the network's output (a host array). ``txn``: the step's transaction
        (minidnn.transaction), whose safe points the executor passes."""
        out = executor.run(self, ctx, [x] if y is None else [x, y], optimizer, t, recorder=recorder, txn=txn)
        return float(out[self.schedule.loss]) if self.schedule.loss is not None else out[self.schedule.outputs[0]]

    # -- views used by the executor, tests and traces ---------------------------
    @property
    def steps(self):
        return self.program.steps

    @property
    def spans(self) -> dict:
        return {k: (r.start, r.end) for k, r in enumerate(self.program.residencies)}

    @property
    def sizes(self) -> dict:
        return {k: self.program.tensors[r.tensor].nbytes for k, r in enumerate(self.program.residencies)}

    @property
    def live_curve(self) -> list:
        from .simulator import memory_curve
        return memory_curve(self.program).tolist()

    @property
    def peak_bytes(self) -> int:
        return self.persistent_bytes + self.arena_bytes

    @property
    def fragmentation_bytes(self) -> int:
        """Plan peak minus the largest sum of bytes live at any step of this plan."""
        return self.arena_bytes - max(self.live_curve, default=0)

    @property
    def predicted_seconds(self):
        return self.simulation.seconds if self.simulation else None

    @property
    def unlimited_seconds(self):
        """The step's predicted seconds with unlimited memory (None: not simulated)."""
        return self.baseline.seconds if self.baseline else None

    @property
    def predicted_overhead(self):
        """Predicted step time relative to unlimited memory, minus one."""
        if not (self.simulation and self.baseline and self.baseline.seconds):
            return None
        return self.simulation.seconds / self.baseline.seconds - 1

    def decisions(self) -> dict:
        """tensor name -> "offload" / "recompute" (for tensors evicted in at least one gap)."""
        out = {}
        for (t, _), ev in (self.evictions or {}).items():
            out.setdefault(self.schedule.tensors[t].name, ev.kind)
        return out

    def summary(self, top=10, run=None) -> str:
        """What the plan decided and predicts. ``run``: what this plan is of a split step (``"one
        sub-batch of 8"``), whose summary states the step's time; its own time is then that run's,
        compared with the same run with unlimited memory, not presented as the step's."""
        f = format_bytes
        lines = [f"plan ({self.policy}){f' of {run}' if run else ''}: {len(self.steps)} steps, "
                 f"{len(self.offsets)} arena buffers",
                 f"  ideal (no reuse)   {f(self.ideal_bytes):>12}  ({self.ideal_bytes} B)",
                 f"  liveness peak      {f(self.liveness_peak_bytes):>12}  ({self.liveness_peak_bytes} B)"]
        precision = self.schedule.graph.precision
        if precision is not None and precision.name != "fp32":
            lines.insert(1, f"  {precision.describe()}")
        if self.lower_bound_bytes is not None:
            lines.append(f"  lower bound        {f(self.lower_bound_bytes):>12}  ({self.lower_bound_bytes} B)")
        if self.minimum_bytes is not None:
            lines.append(f"  planner minimum    {f(self.minimum_bytes):>12}  ({self.minimum_bytes} B)")
        lines.append(f"  plan peak          {f(self.peak_bytes):>12}  ({self.peak_bytes} B) = persistent "
                     f"{f(self.persistent_bytes)} + arena {f(self.arena_bytes)} ({self.placement})")
        lines.append(f"  fragmentation      {f(self.fragmentation_bytes):>12}")
        if self.budget is not None:
            lines.append(f"  budget             {f(self.budget):>12}  ({self.budget} B)")
        kinds = Counter(s.kind for s in self.steps)
        if self.evictions:
            by = Counter(ev.kind for ev in self.evictions.values())
            lines.append(f"  evicted gaps: {by.get('offload', 0)} offloaded, {by.get('recompute', 0)} recomputed; "
                         f"{kinds.get('offload', 0)} offloads, {kinds.get('prefetch', 0)} prefetches, "
                         f"{kinds.get('recompute', 0)} recompute steps; host store {f(self.host_bytes)}")
        changes = self.algorithm_changes
        if changes:
            lines.append(f"  algorithms: {len(changes)} steps traded speed for a smaller workspace")
        sim = self.simulation
        if sim is not None:
            over = self.predicted_overhead
            lines.append(f"  predicted {'run ' if run else 'step'}     {sim.seconds * 1e3:10.2f} ms" +
                         (f"  ({over * 100:+.1f}% vs {'the same run with ' if run else ''}unlimited memory)"
                          if over is not None else "") +
                         f"; stalls {sim.stall_seconds * 1e3:.2f} ms, recompute {sim.recompute_seconds * 1e3:.2f} ms")
        kept = [t for t in self.log if t.kept]
        if kept:
            lines.append(f"  why this plan: {len(self.log)} candidates tried, the fastest that fits kept, in turn:")
            lines += [f"    {t}" for t in kept]
        if top:
            curve = self.live_curve
            at = max(range(len(curve)), key=curve.__getitem__)
            lines.append(f"  peak at step {at}: {self.steps[at].label} ({self.steps[at].kind}); largest live there:")
            live = [r for r in self.program.residencies if r.start <= at <= r.end]
            live.sort(key=lambda r: -self.program.tensors[r.tensor].nbytes)
            for r in live[:top]:
                t = self.program.tensors[r.tensor]
                lines.append(f"    {f(t.nbytes):>12}  {t.category:<20} {t.name}")
        return "\n".join(lines)

    def layer_table(self):
        """Rows (tensor name, bytes, decision) for every evicted tensor, in schedule order."""
        seen = {}
        for (t, _), ev in sorted((self.evictions or {}).items()):
            seen.setdefault(t, ev.kind)
        return [(self.schedule.tensors[t].name, self.schedule.tensors[t].nbytes, k) for t, k in seen.items()]
