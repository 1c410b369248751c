"""A profiling pass: the cost model measured on the running backend (like cuDNN's Find).

``measure_costs`` runs one iteration of the unlimited-memory plan with every
step timed - on a copy of the persistent state, which is restored afterwards,
so training is unaffected - times each convolution algorithm once (cached on
disk by shape, see ``algo_cache``), and measures the copy bandwidth between
arena and host store. The result is a ``MeasuredCost`` the planner uses in
place of a device profile.
"""
from __future__ import annotations


import numpy as np

from .executor import Context
from .memory import MeasuredCost, MemoryConfig, plan_memory


def copy_bandwidth(backend, nbytes=64 << 20, repeats=3) -> float:
    """Bytes per second of one copy between arena and host store buffers of ``nbytes``."""
    return backend.copy_bandwidth(nbytes, repeats)


def copy_overlap(backend) -> float:
    """The fraction of a copy's time that compute beside it keeps (see the backend's copy_overlap)."""
    return backend.copy_overlap()


def measure_costs(trainer, schedule, feeds) -> MeasuredCost:
    """Time every step of ``schedule`` (an iteration of ``trainer``'s model) on ``feeds``."""
    plan = plan_memory(schedule, MemoryConfig(algorithms="default"))
    store = trainer.store
    saved = store.region.copy()                        # the pass must not train
    try:
        trainer.executor.run(plan, Context.on(trainer.backend, np.random.default_rng(0)), feeds,
                             trainer.optimizer, 1, profile=True)
        seconds = list(trainer.executor.step_seconds)
    finally:
        store.region[...] = saved
        trainer.executor.release()                      # the unlimited arena was for measuring only
    algo_seconds = {}
    for s in schedule.steps:
        n = s.node
        if s.kind not in ("forward", "backward") or n is None:
            continue
        ins, outs = [v.spec for v in n.inputs], [o.spec for o in n.outputs]
        if len(n.op.algorithms(ins, outs, s.kind)) > 1:
            for name, sec in trainer.backend.profile_algorithms(n.op, ins, outs, s.kind).items():
                algo_seconds[(s.index, name)] = sec
    return MeasuredCost(seconds, copy_bandwidth(trainer.backend), algo_seconds=algo_seconds,
                        copy_overlap=copy_overlap(trainer.backend))
