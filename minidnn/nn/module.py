"""Module, Parameter and the containers, with PyTorch's naming and state_dict order."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..backend import to_numpy
from ..graph import find_graph


class Parameter:
    """A trainable tensor owned by a module. ``data`` is a NumPy array.

    After ``minidnn.compile`` the array is a view into the trainer's persistent
    region and ``grad`` a view of its gradient there.
    """

    requires_grad = True

    def __init__(self, data):
        self.data = np.require(data, requirements='C')
        self.grad = None
        self.qualname = None

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)

    def numpy(self):
        return self.data

    def __repr__(self):
        return f"Parameter(shape={self.data.shape}, dtype={self.data.dtype.name})"


class Buffer(Parameter):
    """A non-trainable state tensor (BatchNorm running statistics)."""

    requires_grad = False


class Module:
    """Base class of layers and networks, as in PyTorch: subclass and write ``forward``."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"call Module.__init__() before assigning {name!r} in {type(self).__name__}")
        home = (self._buffers if isinstance(value, Buffer) else self._parameters if isinstance(value, Parameter)
                else self._modules if isinstance(value, Module) else None)
        for d in (self._parameters, self._buffers, self._modules):
            if d is not home:
                d.pop(name, None)
        if home is not None:
            home[name] = value          # replacing keeps the position, as in PyTorch
        object.__setattr__(self, name, value)

    def register_buffer(self, name, array):
        setattr(self, name, Buffer(array))

    # -- calling ------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward")

    def __call__(self, *args, **kwargs):
        graph = find_graph(*args)
        path = graph.module_paths.get(id(self), graph.path)
        with graph.scope(path):
            return self.forward(*args, **kwargs)

    # -- traversal ----------------------------------------------------------
    def named_modules(self, prefix=""):
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self):
        return [m for _, m in self.named_modules()]

    def children(self):
        return list(self._modules.values())

    def named_parameters(self):
        seen = set()
        for mp, m in self.named_modules():
            for n, p in m._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{mp}.{n}" if mp else n), p

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def named_buffers(self):
        for mp, m in self.named_modules():
            for n, b in m._buffers.items():
                yield (f"{mp}.{n}" if mp else n), b

    def init_parameters(self, seed):
        """Re-initialize every parameter reproducibly from ``seed``.

        Each layer's ``reset_parameters(rng)`` runs in module order with one
        generator, then each module's ``init_weights(rng)`` (a network's own
        scheme, such as torchvision's He init for ResNets) if it has one.
        """
        rng = np.random.default_rng(seed)
        for m in self.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters(rng)
        for m in self.modules():
            if hasattr(m, "init_weights"):
                m.init_weights(rng)
        return self

    def num_parameters(self):
        return sum(int(p.data.size) for p in self.parameters())

    # -- modes --------------------------------------------------------------
    def train(self, mode=True):
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    # -- state --------------------------------------------------------------
    def state_dict(self):
        """Parameters and buffers by qualified name, in PyTorch's order (arrays, not copies)."""
        sd = OrderedDict()
        for mp, m in self.named_modules():
            for n, p in list(m._parameters.items()) + list(m._buffers.items()):
                sd[f"{mp}.{n}" if mp else n] = p.data
        return sd

    def load_state_dict(self, state_dict, strict=True):
        """Copy arrays into the existing parameters in place; shapes must match."""
        own = OrderedDict()
        for mp, m in self.named_modules():
            for n, p in list(m._parameters.items()) + list(m._buffers.items()):
                own[f"{mp}.{n}" if mp else n] = p
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"state_dict mismatch: missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                           f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}")
        for k, p in own.items():
            if k not in state_dict:
                continue
            v = state_dict[k]
            if not hasattr(v, "shape"):
                v = np.asarray(v)
            if tuple(v.shape) != tuple(p.data.shape):
                raise ValueError(f"{k}: shape {tuple(v.shape)} in state_dict, {p.data.shape} in the model")
            if isinstance(p.data, np.ndarray):
                p.data[...] = to_numpy(v)
            elif type(v) is type(p.data):           # device to device (cuda backend)
                p.data[...] = v
            else:                                   # host data into a parameter in device memory
                p.data.set(np.ascontiguousarray(to_numpy(v), dtype=p.data.dtype))
        return missing, unexpected

    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            sub = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {sub}")
        return "\n".join(lines) + (")" if len(lines) == 1 else "\n)")


class Sequential(Module):
    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            for name, m in modules[0].items():
                setattr(self, name, m)
        else:
            for i, m in enumerate(modules):
                setattr(self, str(i), m)

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, m):
        setattr(self, str(len(self._modules)), m)
        return self

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x


class ModuleList(Module):
    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, m):
        setattr(self, str(len(self._modules)), m)
        return self

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())
