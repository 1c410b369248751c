"""What the exact reference (optimal.py) may remove from its MILP once it has judged a decision vector.

A vector whose plan was made is removed by a no-good cut: at least one of its decisions must
differ. Where the plan placed over the budget, the cut removes with it every vector whose program
has the same buffers (the same decisions, each step's algorithm one of the same aligned workspace):
placement reads only the buffers' lifetimes and sizes, so those place alike.

(The cut once also freed the decisions of tensors smaller than the buffers that overflowed alone,
which holds while buffers are placed largest first. The reference packs its plans as the planner
does where a seed fails (placement.py: lowest first among them), which places large and small
buffers in one order, so it no longer holds.)
"""
from __future__ import annotations

from ..schedule import aligned


def cut_terms(model, x, misplaced=False):
    """(terms, need): the row sum(terms[v] * x[v]) >= need that removes the decision vector ``x``;
    ``misplaced`` (its plan placed over the limit): also the vectors whose programs have the same
    buffers (algorithms of the same aligned workspace)."""
    terms, need = {}, 1.0
    for (t, g), v in list(model.d.items()) + [((t, g), v) for (t, g, _), v in (*model.u.items(), *model.w.items())]:
        if x[v] > 0.5:
            terms[v], need = -1.0, need - 1.0
        else:
            terms[v] = 1.0
    for s, opts in model.options.items():
        chosen = max(range(len(opts)), key=lambda k: x[model.x[s, k]])
        ws = aligned(opts[chosen][1].workspace)
        for k, (_, algo) in enumerate(opts):
            w = aligned(algo.workspace)
            same = k == chosen if not misplaced else w == ws
            if same:
                terms[model.x[s, k]] = -1.0     # 1 - (the step runs one of the same class)
        need -= 1.0
    return terms, need
