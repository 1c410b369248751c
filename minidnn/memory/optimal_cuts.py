"""What the exact reference (optimal.py) may remove from its MILP once it has judged a decision vector.

A vector whose plan was made is removed by a no-good cut: at least one of its decisions must
differ. Where the plan placed over the budget, the cut may remove more, on two facts about the
placement (placement.py, ext/placement.cpp):

- it places buffers largest first, each where the buffers already placed leave room, so the
  buffers of at least ``sigma`` bytes are placed before every smaller one and exactly as they
  would be alone: where they alone (in the single pool, and in the two regions) need more than
  the limit, every program with the same large buffers does too;
- it reads a buffer's lifetime only through which other buffers it overlaps, which inserting
  steps elsewhere in the program does not change.

So the decisions that cannot change a program's buffers of at least ``sigma`` bytes (a small
tensor's, where everything its restore chain would run, write and read is small too; an
algorithm among those with a small workspace) are left free by the cut.
"""
from __future__ import annotations

import numpy as np

from ..schedule import aligned
from .placement import peak, place


def large_threshold(program, limit):
    """The largest ``sigma`` such that the program's buffers of at least ``sigma`` bytes alone need
    more than ``limit`` bytes placed in one pool and in the two regions alike; None where even all
    of them fit one of the two."""
    starts, ends, sizes = program.buffers
    res = program.residencies
    tensor = np.fromiter((r.tensor for r in res), np.int64, len(res))
    mobile = np.fromiter((r.origin != "compute" or r.wait_offload is not None for r in res), bool, len(res))
    mobile = np.isin(tensor, tensor[mobile])

    def arena(mask):
        return peak(place(starts[mask], ends[mask], sizes[mask]), sizes[mask]) if mask.any() else 0

    for sigma in sorted(set(sizes.tolist()), reverse=True):
        big = sizes >= sigma
        if min(arena(big), arena(big & ~mobile) + arena(big & mobile)) > limit:
            return int(sigma)
    return None


def small_tensors(model, sigma, algos) -> set:
    """The arena tensors whose decisions cannot change a program's buffers of at least ``sigma``
    bytes, with these ``algos``: smaller than ``sigma``, and so is everything their restore chain
    may run (the producer's outputs and workspace), recursively through the inputs it reads."""
    steps, tensors = model.schedule.steps, model.schedule.tensors
    memo = {}

    def workspace(p):
        algo = algos.get(p)
        if algo is not None:
            return aligned(algo.workspace)
        ws = steps[p].ws
        return model.size[ws] if ws is not None else 0

    def small(u):
        if u in memo:
            return memo[u]
        memo[u] = False                      # a cycle (none in a schedule) counts as large
        ok = model.size[u] < sigma
        src = model.producer.get(u)
        if ok and src is not None and src.node.op.recomputable:
            outs = [w for w in src.outs if w is not None and not tensors[w].persistent]
            ins = [w for w in src.ins if w is not None and not tensors[w].persistent]
            ok = all(model.size[w] < sigma for w in outs) and workspace(src.index) < sigma and all(map(small, ins))
        memo[u] = ok
        return ok

    return {t for t, _, _, _ in model.gaps if small(t)}


def cut_terms(model, x, misplaced=False, sigma=None, algos=None):
    """(terms, need): the row sum(terms[v] * x[v]) >= need that removes the decision vector ``x``;
    ``misplaced`` (its plan placed over the limit): also the vectors whose programs have the same
    buffers (algorithms of the same aligned workspace); with ``sigma`` (its plan's buffers of at
    least ``sigma`` bytes place over the limit alone, :func:`large_threshold`) every vector with
    the same decisions but on small tensors (:func:`small_tensors`, with ``algos``) and with
    algorithms of the same workspace, or of a workspace below ``sigma`` where its own is."""
    free = small_tensors(model, sigma, algos) if sigma is not None else set()
    terms, need = {}, 1.0
    for (t, g), v in list(model.d.items()) + [((t, g), v) for (t, g, _), v in (*model.u.items(), *model.w.items())]:
        if t in free:
            continue
        if x[v] > 0.5:
            terms[v], need = -1.0, need - 1.0
        else:
            terms[v] = 1.0
    for s, opts in model.options.items():
        chosen = max(range(len(opts)), key=lambda k: x[model.x[s, k]])
        ws = aligned(opts[chosen][1].workspace)
        for k, (_, algo) in enumerate(opts):
            w = aligned(algo.workspace)
            same = (k == chosen if not misplaced else w == ws or (sigma is not None and ws < sigma and w < sigma))
            if same:
                terms[model.x[s, k]] = -1.0     # 1 - (the step runs one of the same class)
        need -= 1.0
    return terms, need
