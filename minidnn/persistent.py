"""The persistent region: parameters, their gradients, optimizer and BN state.

One allocation holds them all for the whole run. Parameters are moved in (their
``data`` becomes a view of the region, cast to the training dtype) so that the
modules, the state_dict and the executor share one copy.
"""
from __future__ import annotations

from .schedule import OPT_STATE, PARAM, PARAM_GRAD, STATE, aligned


class PersistentStore:
    def __init__(self, backend, schedule, optimizer):
        self.backend = backend
        tensors = [t for t in schedule.tensors if t.persistent]
        self.nbytes = sum(aligned(t.nbytes) for t in tensors)
        self.region = backend.empty(self.nbytes)
        self._views = {}                      # (category, id(param), state index) -> array
        off = 0
        for t in tensors:
            p = t.value.param
            key = (t.category, id(p), t.slot)
            view = self.region[off:off + t.nbytes].view(t.spec.dtype).reshape(t.spec.shape)
            off += aligned(t.nbytes)
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
