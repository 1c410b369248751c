"""The persistent region: parameters, their gradients, optimizer and BN state.

One allocation holds them all for the whole run. Parameters are moved in (their
``data`` becomes a view of the region, cast to the training dtype) so that the
modules, the state_dict and the executor share one copy.
"""
from __future__ import annotations

from .schedule import OPT_STATE, PARAM, PARAM_GRAD, STATE, aligned


def persistent_offsets(schedule) -> dict:
    """Byte offset in the persistent region of each persistent tensor of ``schedule``, by tensor id:
    the schedule's order, each buffer aligned (the region :class:`PersistentStore` allocates)."""
    offsets, off = {}, 0
    for t in schedule.tensors:
        if t.persistent:
            offsets[t.id] = off
            off += aligned(t.nbytes)
    return offsets


class PersistentStore:
    def __init__(self, backend, schedule, optimizer):
        self.backend = backend
        self.schedule = schedule               # the schedule whose order lays out the region
        self.nbytes = schedule.persistent_bytes
        self.region = backend.empty(self.nbytes)
        self.region[...] = 0                   # the alignment padding too: a reduced bucket spans it
        self._views = {}                      # (category, id(param), state index) -> array
        for tid, off in persistent_offsets(schedule).items():
            t = schedule.tensor(tid)
            p = t.value.param
            key = (t.category, id(p), t.slot)
            view = self.region[off:off + t.nbytes].view(t.spec.dtype).reshape(t.spec.shape)
            if t.category in (PARAM, STATE):
                backend.write(view, p.data)
                p.data = view
            else:
                view[...] = 0
                if t.category == PARAM_GRAD:
                    p.grad = view
            self._views[key] = view

    def view(self, tensor):
        """The array holding persistent ``tensor`` (possibly of another schedule of the same model)."""
        p = tensor.value.param
        if tensor.category in (PARAM, STATE):
            return p.data
        return self._views[(tensor.category, id(p), tensor.slot)]

    def optimizer_state(self, p, name):
        return self._views[(OPT_STATE, id(p), name)]
