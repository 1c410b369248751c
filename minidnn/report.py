"""What ``minidnn models`` and ``minidnn plan`` print: memory and cost of a training step, no kernels run.

Both trace a network on symbolic inputs, build the schedule of one SGD
iteration and hand it to the memory planner; weights are never drawn (see
:func:`shapes_only`), so even VGG-16 at batch 256 is reported in a fraction of
a second.
"""
from __future__ import annotations

import contextlib

from .errors import MinidnnError
from .memory import MemoryConfig, format_bytes, get_profile, plan_memory
from .memory.bound import step_time_floor
from .memory.costmodel import CachedCost, ProfileCost
from .memory.subbatch import plan_step, runs
from .training import build_model


def _noop(self, *args, **kwargs):
    return None


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


@contextlib.contextmanager
def shapes_only():
    """While active, layers and networks skip drawing their initial weights.

    Tracing needs shapes only, and drawing VGG-16's 138 M weights takes
    seconds. Parameters are left uninitialised (``np.empty``): fine for a
    network that is only traced and planned, and for one whose weights are
    drawn (``init_parameters``) or loaded before it runs.
    """
    from . import models  # noqa: F401  (registers the networks' classes, so they are patched too)
    from .nn import Module
    patched = [(cls, attr, vars(cls)[attr]) for cls in set(_subclasses(Module))
               for attr in ("reset_parameters", "init_weights") if attr in vars(cls)]
    try:
        for cls, attr, _ in patched:
            setattr(cls, attr, _noop)
        yield
    finally:
        for cls, attr, fn in patched:
            setattr(cls, attr, fn)


def _loss_for(net, input_shape):
    """Classifiers get a cross-entropy loss; networks with per-pixel outputs (U-Net) a mean-squared
    error against a target of the output's shape."""
    from .graph import trace
    from .nn import CrossEntropyLoss, MSELoss
    return CrossEntropyLoss() if len(trace(net, input_shape).outputs[0].shape) == 2 else MSELoss()


def training_schedule(net, input_shape, precision="fp32"):
    """(graph, schedule) of one SGD-with-momentum step of ``net`` on ``input_shape`` (N, C, H, W), in
    ``precision`` (minidnn.precision)."""
    from .autograd import build_schedule
    from .graph import trace
    from .optim import SGD
    graph = trace(net, input_shape, loss=_loss_for(net, input_shape), precision=precision)
    return graph, build_schedule(graph, optimizer=SGD(lr=0.1, momentum=0.9))


def step_splits(net, input_shape, precision="fp32"):
    """The :class:`~minidnn.memory.subbatch.Splits` of :func:`training_schedule`'s step: as sub-batches,
    or staged with full-batch BatchNorm statistics."""
    from .optim import SGD
    from .split_graph import step_splits as splits
    return splits(net, input_shape, _loss_for(net, input_shape), SGD(lr=0.1, momentum=0.9), precision=precision)


def sub_batch_schedules(net, input_shape, precision="fp32"):
    """b -> (schedule of a sub-batch of b samples adding its gradients, the update alone): the
    step of :func:`training_schedule` split into sub-batches (see memory.subbatch)."""
    return step_splits(net, input_shape, precision).sub


def _input_shape(name, batch_size, image_size):
    from . import models
    c, h, w = models.default_input(name)
    return (batch_size, c, image_size or h, image_size or w)


def model_row(name, batch_size, image_size=None, precision="fp32"):
    """One row of the models table: a dict of figures, or with ``error`` why the size does not fit."""
    shape = _input_shape(name, batch_size, image_size)
    row = {"model": name, "input_shape": list(shape)}
    try:
        with shapes_only():
            net = build_model(name, image_size=shape[2], in_channels=shape[1])
        graph, schedule = training_schedule(net, shape, precision)
    except (MinidnnError, ValueError) as e:   # ShapeError is both; a factory may raise ValueError
        row["error"] = " ".join(str(e).split())
        return row
    plan = plan_memory(schedule)
    flops = sum(n.op.flops([v.spec for v in n.inputs], [o.spec for o in n.outputs]) for n in graph.nodes)
    row.update(parameters=net.num_parameters(), forward_flops_per_image=flops / batch_size,
               ideal_bytes=plan.ideal_bytes, liveness_peak_bytes=plan.liveness_peak_bytes,
               lower_bound_bytes=plan.lower_bound_bytes)
    return row


def models_table(rows, batch_size, image_size):
    """The rows of :func:`model_row` as aligned text."""
    f = format_bytes
    size = image_size or "each model's own"
    lines = [f"batch {batch_size}, image size {size}; "
             "GFLOPs: forward, per image; memory: one SGD step (momentum), persistent state included",
             f"{'model':<16}{'params':>9}{'GFLOPs':>9}{'ideal':>13}{'liveness peak':>15}{'lower bound':>13}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['model']:<16}{'-':>9}{'-':>9}{'-':>13}{'-':>15}{'-':>13}  size: {r['error'][:70]}")
            continue
        lines.append(f"{r['model']:<16}{r['parameters'] / 1e6:>8.2f}M{r['forward_flops_per_image'] / 1e9:>9.2f}"
                     f"{f(r['ideal_bytes']):>13}{f(r['liveness_peak_bytes']):>15}{f(r['lower_bound_bytes']):>13}")
    return "\n".join(lines)


def make_plan(name, batch_size, image_size=None, budget=None, policy="auto", profile="titanx-12gb",
              sub_batching="fastest", bn="exact", precision="fp32"):
    """The memory plan of one training step of model ``name`` and its input shape: whole, or split
    into sub-batches as ``minidnn.compile`` would split it (``sub_batching``, ``bn``: MemoryConfig's).

    MemoryBudgetError (with the minimum) if ``budget`` cannot be met.
    """
    shape = _input_shape(name, batch_size, image_size)
    get_profile(profile)  # an unknown name fails here, with the known ones, before any work
    with shapes_only():
        net = build_model(name, image_size=shape[2], in_channels=shape[1])
    _, schedule = training_schedule(net, shape, precision)
    config = MemoryConfig(budget=budget, policy=policy, profile=profile, sub_batching=sub_batching, bn=bn)
    return plan_step(schedule, config, splits=step_splits(net, shape, precision)), shape


def _algorithm_changes(plan):
    # Plans from planners without algorithm selection have no such attribute.
    return getattr(plan, "algorithm_changes", None) or {}


def step_floor(plan, profile):
    """The floor under every whole-step plan's time within ``plan``'s budget (memory.bound), or None
    where the plan is unbudgeted, splits the step (a split step is another schedule) or adds nothing."""
    if plan.budget is None or plan.k > 1 or not plan.predicted_overhead:
        return None
    return step_time_floor(plan.schedule, plan.budget, CachedCost(ProfileCost(get_profile(profile))))


_STEP_FIGURES = ("compute_seconds", "recompute_seconds", "copy_seconds", "stall_seconds", "offload_bytes",
                 "prefetch_bytes")


def step_figures(plan) -> dict:
    """The whole step's predicted figures (``_STEP_FIGURES``): a split step's runs (every sub-batch, then
    the update) added up, as its ``predicted_seconds`` adds their times."""
    return {name: sum(getattr(p.simulation, name) for _, p in runs(plan)) for name in _STEP_FIGURES}


def plan_dict(plan, name, shape, profile, policy="auto"):
    """Everything ``minidnn plan --json`` prints: byte figures, decisions and the prediction (the whole
    step's: a split step's sub-batches and update together)."""
    base = plan.baseline or plan.simulation
    over = plan.predicted_overhead
    figures = step_figures(plan)
    # a split step stands for the unsplit one: its unlimited time is that step's, never one run's
    unlimited = plan.unlimited_seconds if plan.k > 1 else plan.unlimited_seconds or base.seconds
    floor = step_floor(plan, profile)
    return {
        "model": name, "input_shape": list(shape), "profile": get_profile(profile).name, "policy": policy,
        "planner": plan.policy,
        "budget_bytes": plan.budget, "persistent_bytes": plan.persistent_bytes, "arena_bytes": plan.arena_bytes,
        "ideal_bytes": plan.ideal_bytes, "liveness_peak_bytes": plan.liveness_peak_bytes,
        "lower_bound_bytes": plan.lower_bound_bytes, "peak_bytes": plan.peak_bytes,
        "fragmentation_bytes": plan.fragmentation_bytes, "host_bytes": plan.host_bytes, "placement": plan.placement,
        "steps": sum(len(p.steps) for _, p in runs(plan)),
        # k > 1: the prediction is the whole split step's; the byte figures and decisions are its plan's
        # (one sub-batch's, or the staged iteration's: memory.subbatch)
        "sub_batches": plan.k, "sub_batch": plan.sub_batch,
        "decisions": [{"tensor": t, "bytes": int(b), "decision": k} for t, b, k in plan.layer_table()],
        "algorithm_changes": [{"step": step, "fastest": fast, "chosen": chosen}
                              for step, (fast, chosen) in _algorithm_changes(plan).items()],
        "prediction": {
            # a split step's overhead and unlimited time are the unsplit step's (the step it stands for)
            "step_seconds": float(plan.predicted_seconds),
            "unlimited_memory_seconds": float(unlimited) if unlimited is not None else None,
            "overhead": float(over) if over is not None else 0.0,
            # a split taken where the whole step fits too: the whole step's plan it was faster than
            "whole_step_seconds": float(plan.whole_seconds) if plan.k > 1 and plan.whole_seconds is not None else None,
            **{k: float(v) if k.endswith("seconds") else int(v) for k, v in figures.items()},
            # no whole-step plan within the budget is predicted faster (None: not computed, see step_floor)
            "floor_seconds": float(floor.seconds) if floor is not None else None},
    }


def plan_text(plan, name, shape, profile, policy="auto"):
    """The plan as ``minidnn plan`` prints it: summary, evicted tensors per layer, prediction."""
    prof = get_profile(profile)
    b, c, h, w = shape
    lines = [f"{name}, batch {b} of {c}x{h}x{w}; policy {policy}; profile {prof.name}: {prof.description}",
             plan.summary(top=5)]
    table = plan.layer_table()
    if table:
        lines.append(f"evicted tensors ({len(table)}), in schedule order:")
        lines.append(f"  {'layer:op (output)':<44}{'size':>12}  decision")
        lines += [f"  {t:<44}{format_bytes(nbytes):>12}  {kind}" for t, nbytes, kind in table]
    else:
        lines.append("nothing is offloaded or recomputed")
    changes = _algorithm_changes(plan)
    if changes:
        lines.append(f"slower algorithms chosen for a smaller workspace ({len(changes)}):")
        lines += [f"  {step:<40}{fast:<26} -> {chosen}" for step, (fast, chosen) in changes.items()]
    if plan.k > 1:
        over = plan.predicted_overhead
        lines.append(f"predicted step time {plan.predicted_seconds * 1e3:.2f} ms as {plan.k} sub-batches of "
                     f"{plan.sub_batch}" + (f"; with unlimited memory {plan.unlimited_seconds * 1e3:.2f} ms unsplit;"
                                            f" overhead {over * 100:+.1f}%" if over is not None else ""))
        return "\n".join(lines)
    sim, base = plan.simulation, plan.baseline or plan.simulation
    over = plan.predicted_overhead or 0.0
    lines.append(f"predicted step time {sim.seconds * 1e3:.2f} ms; with unlimited memory {base.seconds * 1e3:.2f} ms;"
                 f" overhead {over * 100:+.1f}%")
    floor = step_floor(plan, profile)
    if floor is not None:
        lines.append(f"no plan within this budget is predicted faster than {floor.seconds * 1e3:.2f} ms "
                     f"({floor.overhead * 100:+.1f}%: what must leave the device at its highest steps, "
                     f"recomputed or copied in the time there is)")
    return "\n".join(lines)


def ranks_text(pred, system, batch_size):
    """The data-parallel prediction (memory.dataparallel.Prediction) as ``minidnn plan --ranks`` prints it."""
    return (f"{pred.ranks} ranks of {system.name} ({system.description}), global batch {batch_size} = "
            f"{batch_size // pred.ranks} per rank\n" + pred.summary())


def ranks_dict(pred, system):
    """What ``minidnn plan --ranks --json`` adds: the data-parallel prediction's figures."""
    return {"system": system.name, "ranks": pred.ranks, "link": pred.link.name if pred.link else None,
            "buckets": len(pred.buckets), "bucket_bytes": [int(b) for b in pred.bucket_bytes],
            "single_device_seconds": float(pred.single_seconds), "step_seconds": float(pred.seconds),
            "communication_seconds": float(pred.simulation.comm_seconds),
            "exposed_communication_seconds": float(pred.exposed_seconds),
            "speedup": float(pred.speedup), "efficiency": float(pred.efficiency),
            "peak_bytes": int(pred.peak_bytes)}
