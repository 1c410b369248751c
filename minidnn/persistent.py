"""The persistent region: parameters, their gradients, optimizer and BN state.

One allocation holds them all for the whole run. Parameters are moved in (their
``data`` becomes a view of the region, cast to the training dtype) so that the
modules, the state_dict and the executor share one copy. The buffers (BatchNorm's
running statistics, which a step's forwards move) come first and side by side,
so that a step's transaction saves and restores them with one copy
(minidnn.transaction).

The network's arrays are the truth: where one was replaced since the trainer
moved it in (``p.data = ...``, or another trainer compiled on the same network
moved it into its own region), :meth:`PersistentStore.adopt` copies it back in
before the trainer runs, so every trainer of a network trains its current weights.
"""
from __future__ import annotations

from .errors import ShapeError
from .nn.module import Buffer
from .schedule import OPT_STATE, PARAM, PARAM_GRAD, STATE, aligned


def _moved_by_forward(t):
    return t.category == STATE or isinstance(t.value.param, Buffer)


def persistent_offsets(schedule) -> dict:
    """Byte offset in the persistent region of each persistent tensor of ``schedule``, by tensor id:
    the buffers a forward moves first (side by side, so a step's transaction saves them in one copy),
    then the rest in the schedule's order, each aligned (the region :class:`PersistentStore` allocates)."""
    offsets, off = {}, 0
    for t in sorted((t for t in schedule.tensors if t.persistent), key=lambda t: not _moved_by_forward(t)):
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
        self._owned = {}                      # id(param) -> [param, its view, its gradient's view]
        tensors = []
        for tid, off in persistent_offsets(schedule).items():
            t = schedule.tensor(tid)
            tensors.append(t)
            p = t.value.param
            key = (t.category, id(p), t.slot)
            view = self.region[off:off + t.nbytes].view(t.spec.dtype).reshape(t.spec.shape)
            if t.category in (PARAM, STATE):
                backend.write(view, p.data)
                p.data = view
                self._owned.setdefault(id(p), [p, None, None])[1] = view
            else:
                view[...] = 0
                if t.category == PARAM_GRAD:
                    p.grad = view
                    self._owned.setdefault(id(p), [p, None, None])[2] = view
            self._views[key] = view
        self.buffers = self.region[:sum(aligned(t.nbytes) for t in tensors if _moved_by_forward(t))]

    def view(self, tensor):
        """The array holding persistent ``tensor`` (possibly of another schedule of the same model)."""
        return self._views[(tensor.category, id(tensor.value.param), tensor.slot)]

    def optimizer_state(self, p, name):
        return self._views[(OPT_STATE, id(p), name)]

    def adopt(self):
        """Copy in every parameter and buffer array of the network that is no longer this region's
        (cast to the training dtype), and point it back here; its gradient too."""
        for p, view, grad in self._owned.values():
            if view is not None and p.data is not view:
                data = p.data
                if tuple(data.shape) != view.shape:
                    raise ShapeError(f"{p.qualname}: the network's array has shape {tuple(data.shape)}, "
                                     f"the trainer's {view.shape}; load weights with net.load_state_dict")
                self.backend.write(view, data)
                p.data = view
            if grad is not None and p.grad is not grad:
                p.grad = grad

    def save_buffers(self):
        """A copy of the buffers (what a step changes before its update), beside them on the device: a
        host copy would be a blocking device-to-host transfer every step (they are BatchNorm's
        statistics, a few KiB, not in the arena's budget)."""
        return self.buffers.copy()

    def restore_buffers(self, saved):
        self.backend.write(self.buffers, saved)
