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


def copy_overlap(backend, nbytes=32 << 20, repeats=5) -> float:
    """The fraction of a copy's time that compute beside it keeps: 1 when copies are free for compute
    (a GPU's copy engine), 0 when compute stops for them. Times GEMMs alone, a copy alone and
    both at once (the copy on the copy stream); the fastest of ``repeats`` each, as other load
    on the machine only ever slows a run down."""
    a, h = backend.empty(nbytes), backend.host_empty(nbytes)
    a[...] = 1
    m = backend.xp.ones((384, 384), np.float32)
    stream = backend.copy_stream()

    def gemms():
        for _ in range(24):
            m @ m

    def timed(fn):
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    def both():
        done = stream.copy(h, a)
        gemms()
        stream.wait(done)

    try:
        alone_c = min(timed(gemms) for _ in range(repeats))
        alone_x = min(timed(lambda: stream.wait(stream.copy(h, a))) for _ in range(repeats))
        together = min(timed(both) for _ in range(repeats))
    finally:
        stream.close()
    return float(np.clip((alone_c + alone_x - together) / min(alone_c, alone_x), 0.0, 1.0))


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
