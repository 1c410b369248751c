"""What the planner reads of one schedule, derived once.

Every seed, repair, policy, the floor (bound.py) and the exact reference
(optimal_model.py) ask the same questions of a schedule: which steps touch a
tensor, which forward step produces it, where the forward ends, which tensors
stay alive to the end. :class:`Facts` answers them, built once per schedule
(``Facts(schedule)``) and passed down; nothing below it derives them again.
"""
from __future__ import annotations

from collections import defaultdict
from functools import cached_property


class Touches(dict):
    """tensor id -> sorted schedule step indices that touch it (arena tensors only); ``by_step``:
    what each schedule step touches of them (each once, in the step's order), for the lowering."""
    by_step: list

    def ordered(self):
        """(tensor id, steps) by tensor id: the explicit order every list of candidates is built in,
        so that ties among them fall the same way however this map was built."""
        return sorted(self.items())


def arena_touches(schedule) -> list:
    """For each schedule step, the arena tensors it touches: each once, in the step's order."""
    arena = [not t.persistent for t in schedule.tensors]
    return [tuple([t for t in dict.fromkeys(s.touched) if arena[t]]) for s in schedule.steps]


def touches(schedule) -> Touches:
    """The schedule's :class:`Touches`."""
    out = Touches()
    out.by_step = arena_touches(schedule)
    for s, used in zip(schedule.steps, out.by_step):
        for t in used:
            if t in out:
                out[t].append(s.index)
            else:
                out[t] = [s.index]
    return out


class Facts:
    """One schedule's derived facts (read-only once built):

    - ``touch``: its :class:`Touches`;
    - ``forward``: its forward steps, in order; ``last_forward``: the index of the last (-1: none);
    - ``backward``: the indices of its backward steps, in order;
    - ``producer``: tensor id -> the forward step that writes it (a recomputation reruns it);
    - ``keep``: the tensors alive to the end (the outputs and the loss), whose last use is the
      last step; :meth:`last_use`;
    - ``writes``: tensor id -> the steps that write or update it (touched tensors only).
    """

    def __init__(self, schedule, touch=None):
        self.schedule = schedule
        self.touch = touch if touch is not None else touches(schedule)
        self.forward = tuple(s for s in schedule.steps if s.kind == "forward")
        self.last_forward = self.forward[-1].index if self.forward else -1
        self.backward = tuple(s.index for s in schedule.steps if s.kind == "backward")
        self.producer = {t: s for s in self.forward for t in s.outs}
        self.keep = frozenset(schedule.outputs) | (frozenset([schedule.loss]) if schedule.loss is not None
                                                   else frozenset())

    def last_use(self, t) -> int:
        """The last schedule step ``t`` is needed at: the last step for a kept tensor."""
        return len(self.schedule.steps) - 1 if t in self.keep else self.touch[t][-1]

    def only_reads(self, t, i) -> bool:
        """Whether schedule step ``i`` touches ``t`` without writing it (a copy of ``t`` may run beside it)."""
        return i not in self.writes.get(t, ())

    @cached_property
    def writes(self) -> dict:
        out = defaultdict(list)
        for s in self.schedule.steps:
            for t in s.writes + s.updates:
                if t in self.touch:
                    out[t].append(s.index)
        return out
