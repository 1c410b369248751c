"""Capture: run a module's ``forward`` once on symbolic values to get a Graph.

A :class:`Value` stands for a tensor of known shape and dtype; calling layers
and functional ops on values records :class:`Node`s in the value's graph. No
kernel runs while tracing. The graph is reached through the values themselves,
so tracing needs no global state.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .errors import ShapeError


@dataclass(frozen=True)
class Spec:
    """Shape and dtype of a tensor."""

    shape: tuple
    dtype: np.dtype

    @cached_property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


class Value:
    """A symbolic tensor in a graph: what ``forward`` sees while tracing."""

    def __init__(self, graph, vid, spec, kind, name, producer=None):
        self.graph = graph
        self.id = vid
        self.spec = spec
        self.kind = kind          # "input", "label", "param", "state", "activation"
        self.name = name
        self.producer = producer  # the Node that writes it, None for graph inputs
        self.param = None         # the Parameter (or buffer array owner) for params/state

    shape = property(lambda self: self.spec.shape)
    dtype = property(lambda self: self.spec.dtype)
    ndim = property(lambda self: len(self.spec.shape))
    nbytes = property(lambda self: self.spec.nbytes)

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def __add__(self, other):
        from .ops.elementwise import add
        return add(self, other)

    __radd__ = __add__

    def __repr__(self):
        return f"Value({self.name}, shape={self.shape}, dtype={np.dtype(self.dtype).name})"


@dataclass
class Node:
    """One op applied to values: the unit the schedule and planner work on."""

    id: int
    op: object
    inputs: list
    outputs: list = field(default_factory=list)
    path: str = ""             # module path that made it, e.g. "layer1.0.conv1"

    @property
    def label(self):
        return f"{self.path or '<root>'}:{self.op.name}"


class Graph:
    """Values and nodes recorded by tracing, in execution order."""

    def __init__(self):
        self.values: list[Value] = []
        self.nodes: list[Node] = []
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self._param_values: dict[int, Value] = {}
        self._scopes: list[str] = []
        self.module_paths: dict[int, str] = {}

    # -- values -------------------------------------------------------------
    def _new_value(self, spec, kind, name, producer=None) -> Value:
        v = Value(self, len(self.values), spec, kind, name, producer)
        self.values.append(v)
        return v

    def input(self, shape, dtype=np.float32, kind="input", name="input") -> Value:
        v = self._new_value(Spec(tuple(shape), np.dtype(dtype)), kind, name)
        self.inputs.append(v)
        return v

    def param(self, p, kind="param") -> Value:
        """The value standing for a Parameter (or a module buffer) ``p``."""
        v = self._param_values.get(id(p))
        if v is None:
            name = getattr(p, "qualname", None) or f"param{len(self._param_values)}"
            v = self._new_value(Spec(tuple(p.data.shape), p.data.dtype), kind, name)
            v.param = p
            self._param_values[id(p)] = v
        return v

    @property
    def params(self) -> list[Value]:
        return [v for v in self.values if v.kind == "param"]

    @property
    def states(self) -> list[Value]:
        return [v for v in self.values if v.kind == "state"]

    # -- nodes --------------------------------------------------------------
    @property
    def path(self) -> str:
        return self._scopes[-1] if self._scopes else ""

    @contextmanager
    def scope(self, path):
        self._scopes.append(path)
        try:
            yield
        finally:
            self._scopes.pop()

    def apply(self, op, inputs) -> list[Value]:
        """Record ``op`` applied to ``inputs``; return its output values."""
        specs = [v.spec for v in inputs]
        try:
            out_specs = op.infer(*specs)
        except ShapeError as e:
            where = self.path or "<root>"
            shapes = ", ".join(str(s.shape) for s in specs)
            raise ShapeError(f"{where} ({op.name}): {e} [input shapes {shapes}]") from None
        node = Node(len(self.nodes), op, list(inputs), path=self.path)
        base = self.path or op.name
        for i, s in enumerate(out_specs):
            suffix = "" if len(out_specs) == 1 else f".{i}"
            node.outputs.append(self._new_value(s, "activation", f"{base}:{op.name}{suffix}", node))
        self.nodes.append(node)
        return node.outputs

    def consumers(self) -> dict[int, list[Node]]:
        """value id -> nodes that read it, in execution order."""
        out: dict[int, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                out.setdefault(v.id, []).append(n)
        return out


def as_value(graph: Graph, x) -> Value:
    """``x`` as a value of ``graph``: values pass through, parameters are looked up."""
    if isinstance(x, Value):
        return x
    if hasattr(x, "data") and hasattr(x, "requires_grad"):
        return graph.param(x)
    raise TypeError(f"expected a traced value or a Parameter, got {type(x).__name__}")


def find_graph(*args) -> Graph:
    for a in args:
        if isinstance(a, Value):
            return a.graph
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, Value):
                    return b.graph
    raise TypeError("minidnn ops run on traced values: call the module through minidnn.compile")


def trace(module, input_shape, dtype=np.float32, loss=None) -> Graph:
    """Trace ``module`` (and optionally ``loss`` on its output) into a Graph.

    ``input_shape`` includes the batch dimension. With ``loss``, the graph gets
    a label input of ``label_shape`` (default: ``(batch,)`` int64 class indices)
    and its single output is the scalar loss; otherwise the module's outputs.
    """
    g = Graph()
    g.module_paths = {id(m): p for p, m in module.named_modules()}
    if loss is not None:
        g.module_paths[id(loss)] = "loss"
    x = g.input(input_shape, dtype, name="input")
    out = module(x)
    if loss is not None:
        shape, ldtype = loss.label_spec(out.spec)
        y = g.input(shape, ldtype, kind="label", name="label")
        out = loss(out, y)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    for o in outs:
        if not isinstance(o, Value):
            raise TypeError(f"forward must return traced values, got {type(o).__name__}")
    g.outputs = outs
    return g
